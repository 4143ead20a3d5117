"""``TierL3``: a host tier's Redis L3 (``redis_l3.py``) below it: write-back of evicted pages, and
prefetch of a matched prefix back into the tier.

    put / get on the tier                      never wait on Redis
        | a page evicted for room (a copy of its bytes, taken under the tier's lock)
        v
    write-back queue  --(writer thread, batches of one kind)-->  RedisL3.put
    prefetch(hashes)  --(reader thread)--> RedisL3.get  --> the tier's own pages (reserve/commit_put)

Write policy: a page goes to the L3 when the tier evicts it, not when it is written (write-back): the
tier already holds what it was just given, and writing every block and snapshot through would put every
prefill's bytes on one shared Redis. KDA snapshots follow the same rule, prompt-end and turn-end ones
included: the router sends a conversation's next turn to the node whose tier holds its prefix (the
cluster index), so the tier is where it is read back; the L3 catches it once the tier lets it go. The
write-back queue is bounded (``queue_pages``): when Redis is slower than the evictions, the oldest
queued pages are dropped (counted), never a put delayed. A page whose bytes no longer match the
checksum it was committed with is not written (counted).

Read: ``prefetch(hashes, has_state)`` asks the L3 for what the tier lacks of the chain: the KV pages
after the tier's leading run (the L3's own leading run of them), then, for a model with KDA state, the
deepest snapshot the L3 holds within the KV reached, if deeper than the tier's own. They go into the
tier's pages through an ordinary put lease (checksummed on commit like any page), so later ``match``
and ``begin_get`` see them as tier hits, and the cluster index advertises them only from then on (an
L3 page is never advertised as a node's). The hybrid hit rule is the tier's: blocks past the deepest
snapshot are stored but not usable. A prefetch that fails (Redis down, the tier full of leased pages)
is done with what it stored, possibly nothing.
"""

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .host_tier import KDA, KV, EvictedBytes, HostTier
from .page_checksum import page_checksum
from .redis_l3 import RedisL3

log = logging.getLogger(__name__)


class PrefetchTicket:
    """One prefetch: ``done()`` once the reader thread finished it (or it was skipped); then
    ``kv_pages`` / ``kda_pages`` say how many pages it brought into the tier."""

    def __init__(self):
        self.kv_pages = 0
        self.kda_pages = 0
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def done(self) -> bool:
        return self._done.is_set()

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once done (at once when it is already)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        fn()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until done (at most ``timeout_s``); whether it is."""
        return self._done.wait(timeout_s)

    def finish(self, kv_pages: int = 0, kda_pages: int = 0) -> None:
        self.kv_pages, self.kda_pages = kv_pages, kda_pages
        with self._lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn()


@dataclass
class L3KindStats:
    """One kind's L3 counters since start. ``hits`` / ``misses``: KV pages a prefetch asked for and
    found / did not find; for KDA, prefetches that found a deeper snapshot / did not. ``bytes_read``:
    page bytes brought from the L3 into the tier; ``bytes_written``: evicted page bytes stored in the
    L3; ``dropped``: evicted pages not written (queue full, checksum changed, Redis unavailable)."""

    hits: int = 0
    misses: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    dropped: int = 0


@dataclass
class _Prefetch:
    hashes: tuple[bytes, ...]
    has_state: bool
    tenant: str = ""
    ticket: PrefetchTicket = field(default_factory=PrefetchTicket)


class TierL3:
    """The L3 of one ``HostTier``; takes over its eviction sink until ``close``.

    Args:
        tier: the host tier above.
        l3: its Redis L3 (same layout fingerprint).
        queue_pages: evicted pages waiting for Redis at most (the oldest dropped beyond).
        batch_pages: pages per Redis put.
        max_prefetches: prefetches queued at most; one beyond is done at once with nothing.
    """

    def __init__(
        self,
        tier: HostTier,
        l3: RedisL3,
        queue_pages: int = 1024,
        batch_pages: int = 32,
        max_prefetches: int = 64,
    ):
        if queue_pages < 1 or batch_pages < 1 or max_prefetches < 1:
            raise ValueError("queue_pages, batch_pages, max_prefetches: must be >= 1")
        self.tier = tier
        self.l3 = l3
        self.queue_pages = queue_pages
        self.batch_pages = batch_pages
        self.max_prefetches = max_prefetches
        self.prefetches_skipped = 0
        self._stats = {kind: L3KindStats() for kind in tier.kinds}
        self._lock = threading.Condition()
        self._writeback: deque[tuple[str, EvictedBytes]] = deque()
        self._prefetches: deque[_Prefetch] = deque()
        self._writing = 0  # pages taken off the queue and not yet stored (for ``flush``)
        self._stopping = False
        tier.set_eviction_sink(self._evicted)
        self._threads = [
            threading.Thread(target=self._write_loop, name="hicache-l3-write", daemon=True),
            threading.Thread(target=self._read_loop, name="hicache-l3-read", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def prefetch(self, hashes: Sequence[bytes], has_state: bool, tenant: str = "") -> PrefetchTicket:
        """Start bringing what the tier lacks of the chain ``hashes`` from the L3 (see the module
        docstring), as ``tenant``'s pages; returns at once."""
        job = _Prefetch(tuple(hashes), has_state, tenant)
        with self._lock:
            if len(self._prefetches) >= self.max_prefetches or self._stopping or not hashes:
                self.prefetches_skipped += bool(hashes)
                job.ticket.finish()
                return job.ticket
            self._prefetches.append(job)
            self._lock.notify_all()
        return job.ticket

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every evicted page queued so far was handled (stored or dropped); whether it was."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._writeback and not self._writing, timeout_s)

    def stats(self) -> dict[str, L3KindStats]:
        """Each kind's counters (copies)."""
        with self._lock:
            return {kind: L3KindStats(**vars(stats)) for kind, stats in self._stats.items()}

    def close(self) -> None:
        """Stop taking evicted pages, end the threads (queued pages are dropped), close the link."""
        self.tier.set_eviction_sink(None)
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        for thread in self._threads:
            thread.join()
        for job in self._prefetches:
            job.ticket.finish()
        self.l3.close()

    # ---- write-back --------------------------------------------------------------------------

    def _evicted(self, kind: str, pages: list[EvictedBytes]) -> None:
        """The tier's eviction sink (under its lock): queue, never wait."""
        with self._lock:
            self._writeback.extend((kind, page) for page in pages)
            while len(self._writeback) > self.queue_pages:
                dropped_kind, _ = self._writeback.popleft()
                self._stats[dropped_kind].dropped += 1
            self._lock.notify_all()

    def _write_loop(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._writeback or self._stopping)
                if self._stopping:
                    return
                kind = self._writeback[0][0]
                batch = []
                while self._writeback and self._writeback[0][0] == kind and len(batch) < self.batch_pages:
                    batch.append(self._writeback.popleft()[1])
                self._writing = len(batch)
            try:
                self._write(kind, batch)
            except Exception:  # a bug in a background thread must not end write-back silently
                log.exception("hicache L3: write-back of %d %s pages failed", len(batch), kind)
            finally:
                with self._lock:
                    self._writing = 0
                    self._lock.notify_all()

    def _write(self, kind: str, batch: list[EvictedBytes]) -> None:
        intact = [(page.block_hash, page.page) for page in batch if page_checksum(page.page) == page.checksum]
        self.l3.put(kind, intact)
        stats = self._stats[kind]
        with self._lock:
            if self.l3.link.up:
                stats.bytes_written += sum(len(page) for _, page in intact)
                stats.dropped += len(batch) - len(intact)
            else:
                stats.dropped += len(batch)

    # ---- prefetch ----------------------------------------------------------------------------

    def _read_loop(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._prefetches or self._stopping)
                if self._stopping:
                    return
                job = self._prefetches.popleft()
            kv_pages = kda_pages = 0
            try:
                kv_pages, kda_pages = self._load(job.hashes, job.has_state, job.tenant)
            except Exception:  # a prefetch is an optimisation: failing it costs a miss
                log.exception("hicache L3: prefetch of %d blocks failed", len(job.hashes))
            finally:
                job.ticket.finish(kv_pages, kda_pages)

    def _load(self, hashes: Sequence[bytes], has_state: bool, tenant: str) -> tuple[int, int]:
        """Bring the chain's missing KV pages, then its deepest missing snapshot, as ``tenant``'s; pages
        stored of each."""
        held = self.tier.match(hashes, has_state)
        wanted = hashes[held.kv_depth :]
        kv_pages = self.l3.get(KV, wanted, self.tier.kv.page_bytes) if wanted else []
        self._count(KV, hits=len(kv_pages), misses=len(wanted) - len(kv_pages))
        stored_kv = self._store(KV, wanted[: len(kv_pages)], kv_pages, tenant)
        if not (has_state and self.tier.kda is not None):
            return stored_kv, 0
        reach = held.kv_depth + len(kv_pages)
        deepest = max((d for d in held.snapshot_depths if d <= reach), default=0)
        if reach <= deepest:
            return stored_kv, 0
        found = self.l3.get_deepest(KDA, hashes[deepest:reach], self.tier.kda.page_bytes)
        self._count(KDA, hits=found is not None, misses=found is None)
        if found is None:
            return stored_kv, 0
        index, page = found
        return stored_kv, self._store(KDA, [hashes[deepest + index]], [page], tenant)

    def _store(self, kind: str, hashes: Sequence[bytes], pages: Sequence[bytes], tenant: str) -> int:
        """Put ``pages`` into the tier as ``hashes`` (one lease); how many it took (a hash already held,
        being written, or without room is skipped)."""
        if not hashes:
            return 0
        lease = self.tier.reserve_put(kind, hashes, tenant)
        storage = self.tier.arena(kind).storage
        stored = 0
        try:
            for page, data in zip(lease.pages, pages, strict=True):
                if page is not None:
                    storage[page].copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
                    stored += 1
        except BaseException:
            self.tier.abort_put(lease.lease_id)
            raise
        self.tier.commit_put(lease.lease_id)
        with self._lock:
            self._stats[kind].bytes_read += stored * self.tier.arena(kind).page_bytes
        return stored

    def _count(self, kind: str, hits: int, misses: int) -> None:
        with self._lock:
            self._stats[kind].hits += hits
            self._stats[kind].misses += misses
