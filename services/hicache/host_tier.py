"""The node's host tier: KV-block pages and KDA-snapshot pages, apart, behind put and get leases.

Keys are the engine's salted block-hash chain (``common/prefix_hash.py``): a KV page holds the packed
block named by its hash, a KDA page the state slot snapshotted at the end of that block. Two tenants
(or adapters, or models) share a page only when their chain roots are the same salt. A put names its
tenant, who owns the pages it is given; with ``tenant_reserve_pages`` each tenant keeps that many pages
against other tenants' puts (``page_arena.py``).

A write into the tier and a read from it each go through a lease, so a page is never evicted while
its bytes move::

    put:  reserve_put(kind, hashes, tenant) -> PutLease.pages   write the rows   commit_put  (or abort_put)
    get:  match(hashes) -> TierMatch   begin_get(kind, hashes) -> GetLease.pages   read   end_get

``match`` counts nothing (a waiting request is matched on every scheduler pass); the worker counts an
admitted request's lookup once with ``record_lookup``.

Who moves the bytes: a worker in this process copies rows of ``kv.storage`` / ``kda.storage`` with
torch; a worker in another process reads and writes them over NIXL (``services/hicache/server.py``).

Thread-safe: one lock serializes every index change; the pages' checksums are computed outside it,
while their lease keeps them in place.

A tier with an L3 below it (``tier_l3.py``) gets the pages it evicts for room through
``set_eviction_sink``: a copy of each page's bytes, taken before the put that evicted it can write.
"""

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .page_arena import EvictedPage, PageArena, PageMemory
from .page_checksum import page_checksum

log = logging.getLogger(__name__)

KV = "kv"  # packed blocks
KDA = "kda"  # KDA state-slot snapshots
KINDS = (KV, KDA)
NO_LEASE = 0  # the lease id of a put or get that got no page: nothing to end (its end calls do nothing)


@dataclass(frozen=True)
class TierMatch:
    """What the tier holds of a chain (``match``).

    Attributes:
        kv_depth: leading hashes (blocks) whose KV page is held.
        snapshot_depths: depths ``d`` (1-based block counts) with a KDA snapshot under ``hashes[d-1]``.
        usable_depth: the hybrid rule: the deepest snapshot depth <= ``kv_depth`` for a model with KDA
            state (0 when none), ``kv_depth`` for one without.
    """

    kv_depth: int
    snapshot_depths: tuple[int, ...]
    usable_depth: int


@dataclass(frozen=True)
class PutLease:
    """Pages to write, one per hash asked for; ``None``: skip it (already held, being written, or no
    room because every page is leased). ``no_room``: how many of the ``None`` are for lack of room."""

    lease_id: int
    pages: tuple[int | None, ...]
    no_room: int = 0


@dataclass(frozen=True)
class GetLease:
    """Pages to read: the leading hashes asked for that are held and passed their checksum;
    ``checksum_failures`` 1 when the lease stopped at a page whose checksum failed (it was dropped)."""

    lease_id: int
    pages: tuple[int, ...]
    checksum_failures: int = 0


@dataclass(frozen=True)
class TierEvent:
    """An index change for the cluster index: ``block_hash`` of ``kind`` became readable (``inserted``)
    or stopped being (evicted, or dropped as corrupt)."""

    kind: str
    block_hash: bytes
    inserted: bool


@dataclass(frozen=True)
class EvictedBytes:
    """A page evicted for room: its hash, a copy of its bytes and the checksum they had when committed
    (for an L3 to verify before keeping them)."""

    block_hash: bytes
    page: bytes
    checksum: int


EvictionSink = Callable[[str, list[EvictedBytes]], None]


@dataclass(frozen=True)
class KindStats:
    """One kind's counters since start. ``hits`` / ``misses`` (``record_lookup``: once per admitted
    request): for KV, leading blocks of its chain held / not held; for KDA, requests of models with
    state that found a usable snapshot / none.
    ``bytes_in`` / ``bytes_out``: page bytes committed into / leased out of the tier."""

    pages_used: int
    pages_total: int
    page_bytes: int
    hits: int
    misses: int
    evictions: int
    checksum_failures: int
    bytes_in: int
    bytes_out: int


@dataclass(frozen=True)
class _Lease:
    kind: str
    hashes: tuple[bytes, ...]  # put: the hashes given a page; get: the hashes acquired
    put: bool
    expires_at: float


class HostTier:
    """The KV and KDA arenas, their leases and counters.

    Args:
        kv_page_bytes, kda_page_bytes: one packed block / one KDA state slot (``Layout.nbytes``);
            ``kda_page_bytes`` 0: a model without KDA state, no KDA arena (``kda`` is ``None``).
        kv_budget_bytes, kda_budget_bytes: each kind's host memory; each must hold one page.
        layout_fingerprint: the block and slot layouts the pages hold (workers must match it).
        pin: page-lock the arenas.
        page_memory: makes each arena's storage (``PageArena``); ``None``: private host memory.
        lease_ttl_s: a lease not ended this long after it was given is ended by the tier (a put
            aborted, a get released), so a worker that died holding one does not pin its pages for
            ever; it must exceed the longest transfer. ``None``: leases never expire (a tier in the
            worker's own process).
        clock: the monotonic clock leases expire by (tests step it).
        tenant_reserve_pages: KV pages each tenant keeps against other tenants' puts (0: none).
        snapshot_stride: the workers' ``--snapshot-stride`` when the tier knows it (an engine's own tier):
            the KDA arena keeps ``ceil(tenant_reserve_pages / snapshot_stride)`` snapshots per tenant, one
            per stride of its reserved blocks. A ``baton cache`` is not told its workers' stride and keeps
            1: the same number of KDA pages as KV pages (the default stride's ratio).

    Raises:
        ValueError: a page size, budget, reserve or stride that does not fit, naming the field.
    """

    def __init__(
        self,
        kv_page_bytes: int,
        kda_page_bytes: int,
        kv_budget_bytes: int,
        kda_budget_bytes: int,
        layout_fingerprint: str,
        pin: bool | None = None,
        lease_ttl_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        page_memory: PageMemory | None = None,
        tenant_reserve_pages: int = 0,
        snapshot_stride: int = 1,
    ):
        if lease_ttl_s is not None and not lease_ttl_s > 0:
            raise ValueError(f"lease_ttl_s: must be > 0 (or None: never), got {lease_ttl_s}")
        if snapshot_stride < 1:
            raise ValueError(f"snapshot_stride: must be >= 1, got {snapshot_stride}")
        pin_kw = {"page_memory": page_memory} | ({} if pin is None else {"pin": pin})
        self.layout_fingerprint = layout_fingerprint
        self.kv = PageArena(KV, kv_page_bytes, kv_budget_bytes, tenant_reserve=tenant_reserve_pages, **pin_kw)
        if kda_page_bytes == 0 and kda_budget_bytes != 0:
            raise ValueError("kda_budget_bytes: must be 0 when kda_page_bytes is 0 (a model without KDA)")
        kda_reserve = -(-tenant_reserve_pages // snapshot_stride)
        self.kda = (
            PageArena(KDA, kda_page_bytes, kda_budget_bytes, tenant_reserve=kda_reserve, **pin_kw)
            if kda_page_bytes
            else None
        )
        self._lock = threading.Lock()
        self._lease_ids = itertools.count(1)
        self._leases: dict[int, _Lease] = {}  # in the order given, so also by expiry
        self._lease_ttl_s = lease_ttl_s
        self._clock = clock
        self._events: list[TierEvent] | None = None  # None: nobody records them
        self._eviction_sink: EvictionSink | None = None
        self._counters = {kind: {"hits": 0, "misses": 0, "bytes_in": 0, "bytes_out": 0} for kind in KINDS}

    def arena(self, kind: str) -> PageArena:
        """The arena of ``kind`` (``KV`` or ``KDA``)."""
        arena = {KV: self.kv, KDA: self.kda}.get(kind)
        if arena is None:
            raise ValueError(f"kind: {kind!r} is not a kind this tier holds (it holds {self.kinds})")
        return arena

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds with an arena."""
        return (KV, KDA) if self.kda is not None else (KV,)

    # ---- lookup ------------------------------------------------------------------------------

    def match(self, hashes: Sequence[bytes], has_state: bool) -> TierMatch:
        """How much of the chain ``hashes`` the tier holds; changes nothing, counts nothing."""
        with self._lock:
            kv_depth = self.kv.leading_depth(hashes)
            snapshots = ()
            if self.kda is not None:
                snapshots = tuple(d for d in range(1, len(hashes) + 1) if self.kda.holds(hashes[d - 1]))
            usable = max((d for d in snapshots if d <= kv_depth), default=0) if has_state else kv_depth
            return TierMatch(kv_depth, snapshots, usable)

    def record_lookup(self, kv_hits: int, kv_misses: int, kda_hits: int, kda_misses: int) -> None:
        """Count one admitted request's lookup (the ``match`` it was admitted on) in ``hits`` and
        ``misses``: KV blocks held / not held; with KDA state, 1 in ``kda_hits`` or ``kda_misses``.

        Raises:
            ValueError: a negative count, naming it.
        """
        counts = {"kv_hits": kv_hits, "kv_misses": kv_misses, "kda_hits": kda_hits, "kda_misses": kda_misses}
        for field, count in counts.items():
            if count < 0:
                raise ValueError(f"{field}: must be >= 0, got {count}")
        with self._lock:
            self._counters[KV]["hits"] += kv_hits
            self._counters[KV]["misses"] += kv_misses
            self._counters[KDA]["hits"] += kda_hits
            self._counters[KDA]["misses"] += kda_misses

    # ---- put ---------------------------------------------------------------------------------

    def reserve_put(self, kind: str, hashes: Sequence[bytes], tenant: str = "") -> PutLease:
        """Pages to write ``hashes`` into (see ``PutLease``), owned by ``tenant`` ("": the anonymous
        tenant), evicting only what ``tenant`` may (``page_arena.py``); nothing is findable before
        ``commit_put``."""
        with self._lock:
            self._expire_leases()
            arena = self.arena(kind)
            pages, evicted, no_room = arena.reserve(list(hashes), tenant)
            self._record(kind, [page.block_hash for page in evicted], inserted=False)
            self._sink_evicted(kind, arena, evicted)
            given = tuple(h for h, page in zip(hashes, pages, strict=True) if page is not None)
            if not given:
                return PutLease(NO_LEASE, pages, no_room)
            return PutLease(self._give(_Lease(kind, given, True, self._expiry())), pages, no_room)

    def commit_put(self, lease_id: int) -> None:
        """The put's pages are written: checksum them and make them findable (``NO_LEASE``: nothing)."""
        if lease_id == NO_LEASE:
            return
        with self._lock:
            lease = self._pop_lease(lease_id, put=True)
            arena = self.arena(lease.kind)
            pages = arena.writing_pages(lease.hashes)
        checksums = [page_checksum(arena.storage[page]) for page in pages]  # still reserved: stay put
        with self._lock:
            inserted = arena.commit(lease.hashes, checksums)
            self._record(lease.kind, inserted, inserted=True)
            self._counters[lease.kind]["bytes_in"] += len(inserted) * arena.page_bytes

    def abort_put(self, lease_id: int) -> None:
        """The put's pages were not (fully) written: give them back (``NO_LEASE``: nothing)."""
        if lease_id == NO_LEASE:
            return
        with self._lock:
            lease = self._pop_lease(lease_id, put=True)
            self.arena(lease.kind).abort(lease.hashes)

    # ---- get ---------------------------------------------------------------------------------

    def begin_get(self, kind: str, hashes: Sequence[bytes]) -> GetLease:
        """Lease the leading held pages of ``hashes`` for reading, checksums verified (a corrupt page is
        dropped, counted, and the lease stops before it)."""
        with self._lock:
            self._expire_leases()
            arena = self.arena(kind)
            pages, expected = arena.acquire(list(hashes))
        # Leased: no put or eviction touches them while they are checked.
        good = next(
            (i for i, page in enumerate(pages) if page_checksum(arena.storage[page]) != expected[i]),
            len(pages),
        )
        with self._lock:
            failed = int(good < len(pages))
            if failed:
                if arena.reject(hashes[good : len(pages)], expected[good]):
                    self._record(kind, [hashes[good]], inserted=False)
                pages = pages[:good]
            self._counters[kind]["bytes_out"] += len(pages) * arena.page_bytes
            if not pages:
                return GetLease(NO_LEASE, (), failed)
            lease_id = self._give(_Lease(kind, tuple(hashes[: len(pages)]), False, self._expiry()))
            return GetLease(lease_id, tuple(pages), failed)

    def end_get(self, lease_id: int) -> None:
        """The get's pages have been read: they may be evicted again (``NO_LEASE``: nothing)."""
        if lease_id == NO_LEASE:
            return
        with self._lock:
            lease = self._pop_lease(lease_id, put=False)
            self.arena(lease.kind).release(lease.hashes)

    def set_eviction_sink(self, sink: EvictionSink | None) -> None:
        """From now on hand every page evicted for room to ``sink(kind, [EvictedBytes])``, called under
        the tier's lock: it must only queue them (``TierL3``). ``None``: stop."""
        with self._lock:
            self._eviction_sink = sink

    # ---- reporting ---------------------------------------------------------------------------

    def record_events(self) -> set[tuple[str, bytes]]:
        """Start recording index changes (for the cluster index); returns every ``(kind, hash)`` held
        now, the state the events that follow change."""
        with self._lock:
            self._events = []
            return {(kind, h) for kind in self.kinds for h in self.arena(kind).held_hashes()}

    def take_events(self) -> list[TierEvent]:
        """Index changes since the last call, oldest first (empty until ``record_events``)."""
        with self._lock:
            if not self._events:
                return []
            events, self._events = self._events, []
            return events

    def stats(self) -> dict[str, KindStats]:
        """Each kind's ``KindStats``."""
        with self._lock:
            return {kind: self._kind_stats(kind) for kind in self.kinds}

    def open_leases(self) -> int:
        """Leases not yet committed, aborted or ended."""
        with self._lock:
            return len(self._leases)

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` unless each arena is consistent."""
        with self._lock:
            for kind in self.kinds:
                self.arena(kind).check_integrity()

    # ---- internals ---------------------------------------------------------------------------

    def _record(self, kind: str, hashes: list[bytes], inserted: bool) -> None:
        if self._events is not None:
            self._events += [TierEvent(kind, h, inserted) for h in hashes]

    def _sink_evicted(self, kind: str, arena: PageArena, evicted: list[EvictedPage]) -> None:
        """Copy the evicted pages out now: the put that took them writes once ``reserve_put`` returns."""
        if self._eviction_sink is not None and evicted:
            copies = [
                EvictedBytes(page.block_hash, arena.storage[page.page].numpy().tobytes(), page.checksum)
                for page in evicted
            ]
            self._eviction_sink(kind, copies)

    def _expiry(self) -> float:
        return self._clock() + self._lease_ttl_s if self._lease_ttl_s is not None else float("inf")

    def _give(self, lease: _Lease) -> int:
        lease_id = next(self._lease_ids)
        self._leases[lease_id] = lease
        return lease_id

    def _expire_leases(self) -> None:
        """End the leases past their expiry (the oldest first; they are in the order given)."""
        now = self._clock()
        while self._leases:
            lease_id, lease = next(iter(self._leases.items()))
            if lease.expires_at > now:
                return
            del self._leases[lease_id]
            arena = self.arena(lease.kind)
            if lease.put:
                arena.abort(lease.hashes)
            else:
                arena.release(lease.hashes)
            what = "put" if lease.put else "get"
            log.warning(
                "host tier: %s lease %d of %d %s pages expired unended",
                what,
                lease_id,
                len(lease.hashes),
                lease.kind,
            )

    def _pop_lease(self, lease_id: int, put: bool) -> _Lease:
        lease = self._leases.get(lease_id)
        if lease is None or lease.put != put:
            what = "put" if put else "get"
            raise ValueError(
                f"lease_id: {lease_id} is not an open {what} lease (ended, expired, or never given)"
            )
        del self._leases[lease_id]
        return lease

    def _kind_stats(self, kind: str) -> KindStats:
        arena = self.arena(kind)
        counters = self._counters[kind]
        return KindStats(
            pages_used=arena.pages_used,
            pages_total=arena.num_pages,
            page_bytes=arena.page_bytes,
            evictions=arena.evictions,
            checksum_failures=arena.checksum_failures,
            **counters,
        )
