"""The router's view of its prefill and decode workers: stubs, health, and which one takes a request."""

import itertools
import logging
import threading
import time
import weakref
import zlib
from dataclasses import dataclass, field, replace

import grpc

from common.cluster_index import ClusterIndex
from common.internal_tls import InternalTls, insecure_or_internal_channel
from common.rpc.cluster_secret_interceptor import with_cluster_secret
from proto.baton.v1 import workers_pb2, workers_pb2_grpc

from .load_watcher import LoadWatcher
from .prefix_index import ChainSalt, PrefixIndex, PromptHashes

log = logging.getLogger(__name__)
_PROBE_TIMEOUT_S = 0.5
# A worker's feed sends at least a keepalive a second (services/load_feed.py); one that says nothing
# for this long is cut off and marked down. Generous: a handler thread on a loaded machine may lag.
_SILENCE_S = 5.0
# A prompt block the worker's node tier holds (HiCache) is loaded host -> device instead of computed,
# which is not free: it counts this much of a block in the worker's own device pool.
TIER_HIT_WEIGHT = 0.5


@dataclass(frozen=True)
class Load:
    """A worker's load as the router last heard it, plus what the router sent it since."""

    running: int = 0
    free_blocks: int = 0
    queued_prompt_tokens: int = 0
    block_size: int = 1
    draining: bool = False
    adapters: tuple[str, ...] = ()  # LoRA adapters loaded there
    node: str = ""  # the node whose HiCache tier it uses (its name in the cluster index)

    @classmethod
    def from_pb(cls, stats: workers_pb2.WorkerStats) -> "Load":
        return cls(
            running=stats.running,
            free_blocks=stats.free_blocks,
            queued_prompt_tokens=stats.queued_prompt_tokens,
            block_size=max(stats.block_size, 1),
            draining=stats.draining,
            adapters=tuple(stats.adapters),
            node=stats.node,
        )


@dataclass
class Worker:
    """One worker: its role, address, name (from its stats) and stub; ``up`` is the router's view.

    ``load``: its latest load (None until its feed first answers); ``layout``: its handoff layout (from
    its feed's full pictures; None until one says it); ``removed``: discovery took it out of the pool.
    Requests already holding it finish on it; its channel closes once the last of them lets go of the
    object.
    """

    role: str
    address: str
    stub: object
    channel: grpc.Channel
    name: str = ""
    up: bool = True
    down_since: float = 0.0
    removed: bool = False
    load: Load | None = None
    layout: workers_pb2.CacheLayout | None = None
    watcher: LoadWatcher | None = field(default=None, repr=False)


class WorkerPool:
    """Prefill and decode workers by address, chosen from each worker's pushed load.

    Every worker's load feed (``WatchLoad``) stays open on a ``LoadWatcher`` thread, so choosing a
    worker reads the latest view and makes no call. Decode workers are tried least-loaded first
    (running requests, then free blocks); a session sticks to the decode worker its id hashes to while
    that one has room. Prefill workers are ranked by the prompt tokens whose blocks they hold in their
    prefix cache (``PrefixIndex``, kept from the feeds' cache events) minus the prompt tokens already
    queued on them, so a shared prefix goes back where it is cached unless that worker is busier than
    the hit is worth. With a ``cluster_index`` (HiCache's, in Redis), the blocks the worker's node tier
    holds beyond its device hit count too, at ``TIER_HIT_WEIGHT`` each and only up to the tier's usable
    depth (its deepest KDA snapshot when ``has_state``): a prefix in the device pool beats the same
    prefix in the node's tier, which beats none. Between two updates, ``assigned`` adds what the
    router itself sent, so a burst spreads.

    A worker whose feed breaks, or that fails a call and then a ``check``, is marked down and skipped;
    its feed reconnects with backoff (at most ``probe_interval_s`` apart) and the first answer brings
    it back. A worker whose stats say ``draining`` is up but never chosen. With ``start_probing``, a
    background thread also cuts off a feed that has gone silent (no keepalive), so a hung worker is
    marked down too.

    Membership changes with ``update`` (worker discovery). ``prefill`` and ``decode`` are replaced,
    never changed in place (copy-on-write under the lock), so a request thread that read a list keeps
    a consistent one. Either may be empty for a while: requests then fail with UNAVAILABLE.

    Args:
        prefill: ``host:port`` of each prefill worker (none: decode workers prefill everything).
        decode: ``host:port`` of each decode worker (may start empty when discovery fills it).
        on_health: called with ``(worker, up)`` whenever a worker's state changes (metrics): ``up``
            is True or False while the worker is in the pool, None once ``update`` removed it.
        cluster_index: HiCache's cluster index (a reader), or None: device pools only. Anything with
            ``ClusterIndex.lookup``'s signature; its nodes are the workers' ``WorkerStats.node``.
        has_state: the model has KDA state (the hybrid hit rule applies to tier hits).
        cluster_secret: sent on every call to every worker (``--cluster-secret-file``); "": none.
        internal_tls: the cluster's internal mutual TLS (``common/internal_tls.py``), or None: plaintext.
    """

    def __init__(
        self,
        prefill: list[str],
        decode: list[str],
        on_health=None,
        probe_interval_s: float = 1.0,
        cluster_index: ClusterIndex | None = None,
        has_state: bool = True,
        cluster_secret: str = "",
        internal_tls: InternalTls | None = None,
    ):
        self._cluster_secret = cluster_secret
        self._internal_tls = internal_tls
        self.prefill: list[Worker] = []
        self.decode: list[Worker] = []
        self.on_health = on_health or (lambda worker, up: None)
        self.probe_interval_s = probe_interval_s
        self.prefixes = PrefixIndex()
        self.cluster_index = cluster_index
        self.has_state = has_state
        self._rotation = itertools.count()
        self._lock = threading.Lock()
        self._stop_probing = threading.Event()
        self._prober: threading.Thread | None = None
        self.update(prefill, decode)

    def start_probing(self) -> None:
        """From now until ``close``, cut off feeds that have gone silent (their workers are marked down)."""
        if self._prober is None:
            self._prober = threading.Thread(target=self._probe, name="worker-prober", daemon=True)
            self._prober.start()

    def _probe(self) -> None:
        while not self._stop_probing.wait(min(self.probe_interval_s, 1.0)):
            now = time.monotonic()
            for worker in self.prefill + self.decode:
                if worker.watcher is not None and worker.watcher.silent(now, _SILENCE_S):
                    log.warning("%s worker %s: its load feed went silent", worker.role, worker.address)
                    worker.watcher.restart()  # the watcher marks it down and reconnects

    def update(self, prefill: list[str], decode: list[str]) -> None:
        """Make the pool exactly these workers: connect the new addresses, drop the vanished ones.

        A kept address keeps its ``Worker`` (health, name, feed). A dropped worker leaves the lists,
        the prefix index and (``on_health(worker, None)``) the metrics at once, and its feed stops;
        requests holding it finish on it, and its channel closes when the last of them lets go
        (``Worker.removed``).
        """
        dropped: list[Worker] = []
        with self._lock:
            self.prefill = self._replace(
                "prefill", self.prefill, prefill, workers_pb2_grpc.PrefillWorkerStub, dropped
            )
            self.decode = self._replace(
                "decode", self.decode, decode, workers_pb2_grpc.DecodeWorkerStub, dropped
            )
        for worker in dropped:  # outside the lock: its watcher may be waiting for it
            if worker.watcher is not None:
                worker.watcher.stop()

    def _replace(
        self, role: str, current: list[Worker], addresses: list[str], stub_class, dropped: list[Worker]
    ) -> list[Worker]:
        """The new list for one role (called under the lock); dropped workers are added to ``dropped``."""
        kept = {worker.address: worker for worker in current}
        wanted = list(dict.fromkeys(addresses))  # order kept, duplicates dropped
        for worker in current:
            if worker.address not in wanted:
                worker.removed = True
                self.prefixes.forget(worker.address)
                self.on_health(worker, None)
                dropped.append(worker)
                log.info("%s worker %s left the pool", role, worker.address)
        fresh = []
        for address in wanted:
            worker = kept.get(address)
            if worker is None:
                worker = self._connect(role, address, stub_class)
                self.on_health(worker, True)
                log.info("%s worker %s joined the pool", role, address)
            fresh.append(worker)
        return fresh

    def _connect(self, role: str, address: str, stub_class) -> Worker:
        channel = with_cluster_secret(
            insecure_or_internal_channel(address, self._internal_tls), self._cluster_secret
        )
        worker = Worker(role=role, address=address, stub=stub_class(channel), channel=channel)
        # Closed once nothing holds the worker: the pool after ``update`` removed it (and its watcher
        # stopped), or a request that was still running on it. (Earlier would cancel that request.)
        weakref.finalize(worker, channel.close).atexit = False
        worker.watcher = LoadWatcher(
            address,
            worker.stub,
            on_message=lambda update: self._heard(worker, update),
            on_broken=lambda: self._lost(worker),
            retry_max_s=self.probe_interval_s,
        )
        return worker

    def decode_order(self, session_id: str, timeout_s: float) -> list[Worker]:
        """Decode workers that take new work, in the order to try: the session's own first, then by
        load. Waits (up to ``timeout_s``) only for a worker whose feed has not answered yet."""
        decode = self.decode  # one snapshot: ``update`` may replace the list meanwhile
        _await_first_answers(decode, timeout_s)
        with self._lock:
            loads = [
                ((worker.load.running, -worker.load.free_blocks), worker)
                for worker in decode
                if _takes_work(worker)
            ]
        ordered = [worker for _, worker in sorted(loads, key=lambda pair: pair[0])]
        if session_id and ordered:
            home = decode[zlib.crc32(session_id.encode()) % len(decode)]
            if home in ordered:
                ordered.remove(home)
                ordered.insert(0, home)
        return ordered

    def prefill_order(self, prompt: PromptHashes, timeout_s: float) -> list[Worker]:
        """Prefill workers that take new work, best first: the prompt tokens whose blocks each holds
        (its device pool, then its node's tier at ``TIER_HIT_WEIGHT``) minus the prompt tokens queued
        on it. Equal scores rotate, so a cold start spreads requests round-robin. Waits (up to
        ``timeout_s``) only for a worker whose feed has not answered yet; the cluster index costs one
        Redis round trip per distinct chain salt (none while Redis is down)."""
        prefill = self.prefill
        _await_first_answers(prefill, timeout_s)
        with self._lock:
            ranked = [worker for worker in prefill if _takes_work(worker)]
            salts = [self.prefixes.salt(worker.address) for worker in ranked]
        hashes = [prompt.under(salt) if salt is not None else [] for salt in salts]  # outside the lock
        tier_tokens = self._tier_tokens(ranked, salts, hashes)
        start = next(self._rotation) % len(ranked) if ranked else 0
        order = list(range(start, len(ranked))) + list(range(start))
        with self._lock:
            device_tokens = {i: self.prefixes.match_tokens(ranked[i].address, hashes[i]) for i in order}
            scores = {
                i: device_tokens[i]
                + TIER_HIT_WEIGHT * max(0, tier_tokens[i] - device_tokens[i])
                - (ranked[i].load.queued_prompt_tokens if ranked[i].load else 0)
                for i in order
            }
        return [ranked[i] for i in sorted(order, key=lambda i: -scores[i])]

    def _tier_tokens(
        self, workers: list[Worker], salts: list[ChainSalt | None], hashes: list[list[bytes]]
    ) -> list[int]:
        """Per worker: the leading prompt tokens its node's tier can load (the usable depth), from one
        cluster index lookup per distinct salt; 0 without an index, a node or a salt."""
        tokens = [0] * len(workers)
        if self.cluster_index is None:
            return tokens
        by_salt: dict[ChainSalt, dict] = {}
        for i, (worker, salt) in enumerate(zip(workers, salts, strict=True)):
            node = worker.load.node if worker.load is not None else ""
            if salt is None or not node or not hashes[i]:
                continue
            if salt not in by_salt:
                by_salt[salt] = self.cluster_index.lookup(hashes[i], self.has_state)
            match = by_salt[salt].get(node)
            if match is not None:
                tokens[i] = match.usable_depth * salt.block_size
        return tokens

    def adapters(self) -> set[str]:
        """LoRA adapters some reachable worker reports loaded (its feed's latest ``WorkerStats``)."""
        with self._lock:
            workers = [*self.prefill, *self.decode]
        return {name for w in workers if w.up and w.load is not None for name in w.load.adapters}

    def prefix_tokens(self, worker: Worker, prompt: PromptHashes) -> int:
        """Leading prompt tokens whose blocks ``worker`` holds, as its feed last said."""
        with self._lock:
            salt = self.prefixes.salt(worker.address)
        if salt is None:
            return 0
        hashes = prompt.under(salt)
        with self._lock:
            return self.prefixes.match_tokens(worker.address, hashes)

    def assigned(self, worker: Worker, prompt_tokens: int) -> None:
        """The router sent ``worker`` a request of ``prompt_tokens``: count it in the worker's view until
        the worker's next update (which has it, or has already finished it) replaces that view."""
        with self._lock:
            load = worker.load
            if load is None:
                return
            blocks = -(-prompt_tokens // load.block_size)
            queued = load.queued_prompt_tokens + (prompt_tokens if worker.role == "prefill" else 0)
            worker.load = replace(
                load,
                running=load.running + 1,
                free_blocks=max(0, load.free_blocks - blocks),
                queued_prompt_tokens=queued,
            )

    def check(self, worker: Worker) -> bool:
        """Probe a worker after a failed call; mark it down if it does not answer. Returns ``up``.
        (Off the request's happy path: only a failed call leads here.)"""
        try:
            stats = worker.stub.Stats(workers_pb2.StatsRequest(), timeout=_PROBE_TIMEOUT_S)
        except grpc.RpcError:
            self.mark_down(worker)
            return False
        with self._lock:
            if worker.up and not worker.removed:
                worker.load = Load.from_pb(stats)  # e.g. draining, sooner than its feed says so
        return worker.up

    def mark_down(self, worker: Worker) -> None:
        """Skip this worker until its feed answers again (it reconnects); it forgets its prefixes."""
        self._down(worker)
        if worker.watcher is not None:
            worker.watcher.restart()

    def _down(self, worker: Worker) -> None:
        with self._lock:
            if not worker.removed:
                self.prefixes.forget(worker.address)  # a restarted worker comes back with an empty cache
            worker.up, worker.down_since, worker.load = False, time.monotonic(), None
            self._report(worker, False)

    def _heard(self, worker: Worker, update: workers_pb2.LoadUpdate) -> None:
        """A message of ``worker``'s feed (its watcher's thread): the new view; a full picture also
        replaces its prefixes and brings it back up."""
        with self._lock:
            if worker.removed:
                return
            worker.name = update.stats.worker or worker.name
            if update.full:
                salt = None
                if update.prefix_caching and update.stats.block_size:
                    salt = ChainSalt(update.model_fingerprint, update.stats.block_size)
                self.prefixes.reset(worker.address, salt, update.inserted)
                if update.HasField("layout"):
                    worker.layout = update.layout
                if not worker.up:
                    worker.up = True
                    self._report(worker, True)
            elif not worker.up:
                return  # a late message of a stream cut off when it was marked down
            else:
                self.prefixes.apply(worker.address, update.inserted, update.evicted)
            worker.load = Load.from_pb(update.stats)

    def _lost(self, worker: Worker) -> None:
        """``worker``'s feed broke, or could not be opened (its watcher's thread)."""
        if worker.up:
            log.warning("%s worker %s: its load feed broke; marked down", worker.role, worker.address)
            self._down(worker)

    def _report(self, worker: Worker, up: bool) -> None:
        """``on_health`` for a worker still in the pool (called under the lock, so a removed worker's
        gauge, once dropped, is never set again by a request still finishing on it)."""
        if not worker.removed:
            self.on_health(worker, up)

    def close(self) -> None:
        """Stop watching and probing, and close every channel (the router is stopping)."""
        self._stop_probing.set()
        if self._prober is not None:
            self._prober.join(timeout=5)
        workers = self.prefill + self.decode
        for worker in workers:
            if worker.watcher is not None:
                worker.watcher.stop()
        for worker in workers:
            worker.channel.close()


def _takes_work(worker: Worker) -> bool:
    """Up, heard from, and not stopping (a draining worker finishes its own requests, takes no new
    one). Called under the pool's lock."""
    return worker.up and worker.load is not None and not worker.load.draining


def _await_first_answers(workers: list[Worker], timeout_s: float) -> None:
    """Wait for the feeds that have not answered or failed even once (a pool just connected), at
    most ``timeout_s`` in all; no wait at all once every feed has."""
    deadline = time.monotonic() + timeout_s
    for worker in workers:
        if worker.watcher is not None and not worker.watcher.settled.is_set():
            worker.watcher.settled.wait(max(0.0, deadline - time.monotonic()))
