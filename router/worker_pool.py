"""The router's view of its prefill and decode workers: stubs, health, and which one takes a request."""

import itertools
import logging
import threading
import time
import weakref
import zlib
from dataclasses import dataclass

import grpc

from proto.baton.v1 import workers_pb2, workers_pb2_grpc

from .prefix_index import PrefixIndex

log = logging.getLogger(__name__)
_PROBE_TIMEOUT_S = 0.5
# What the background prober gives a worker it believes up: a dead process answers at once (the
# connection is refused), a live one on a loaded machine may take a while; marking it down for that
# would fail requests it could have served.
_UP_PROBE_TIMEOUT_S = 2.0


@dataclass
class Worker:
    """One worker: its role, address, name (from its stats) and stub; ``up`` is the router's view.

    ``removed``: discovery took it out of the pool. Requests already holding it finish on it; its
    channel closes once the last of them lets go of the object.
    """

    role: str
    address: str
    stub: object
    channel: grpc.Channel
    name: str = ""
    up: bool = True
    down_since: float = 0.0
    removed: bool = False


class WorkerPool:
    """Prefill and decode workers by address.

    Decode workers are tried least-loaded first (``Stats``: running requests, then free blocks); a
    session sticks to the decode worker its id hashes to while that one has room. Prefill workers
    are ranked by the prompt tokens they probably hold in their prefix cache (``PrefixIndex``) minus
    the prompt tokens already queued on them, so a shared prefix goes back where it is cached unless
    that worker is busier than the hit is worth.

    A worker that fails is marked down (``mark_down``) and skipped; it is probed again every
    ``probe_interval_s`` and comes back when its ``Stats`` answers. A worker whose stats say
    ``draining`` is up but never chosen. With ``start_probing``, a background thread also probes every
    worker each ``probe_interval_s``, so a worker that dies while no request needs it is marked down
    (``baton_worker_up`` 0) within about that interval.

    Membership changes with ``update`` (worker discovery). ``prefill`` and ``decode`` are replaced,
    never changed in place (copy-on-write under the lock), so a request thread that read a list keeps
    a consistent one. Either may be empty for a while: requests then fail with UNAVAILABLE.

    Args:
        prefill: ``host:port`` of each prefill worker (none: decode workers prefill everything).
        decode: ``host:port`` of each decode worker (may start empty when discovery fills it).
        on_health: called with ``(worker, up)`` whenever a worker's state changes (metrics): ``up``
            is True or False while the worker is in the pool, None once ``update`` removed it.
    """

    def __init__(
        self,
        prefill: list[str],
        decode: list[str],
        on_health=None,
        probe_interval_s: float = 1.0,
    ):
        self.prefill: list[Worker] = []
        self.decode: list[Worker] = []
        self.on_health = on_health or (lambda worker, up: None)
        self.probe_interval_s = probe_interval_s
        self.prefixes = PrefixIndex()
        self._rotation = itertools.count()
        self._lock = threading.Lock()
        self._stop_probing = threading.Event()
        self._prober: threading.Thread | None = None
        self.update(prefill, decode)

    def start_probing(self) -> None:
        """Probe every worker in the background from now until ``close``."""
        if self._prober is None:
            self._prober = threading.Thread(target=self._probe, name="worker-prober", daemon=True)
            self._prober.start()

    def _probe(self) -> None:
        while not self._stop_probing.wait(self.probe_interval_s):
            self._stats(self.prefill + self.decode, _UP_PROBE_TIMEOUT_S)  # marks down, and up again

    def update(self, prefill: list[str], decode: list[str]) -> None:
        """Make the pool exactly these workers: connect the new addresses, drop the vanished ones.

        A kept address keeps its ``Worker`` (health, name). A dropped worker leaves the lists, the
        prefix index and (``on_health(worker, None)``) the metrics at once; requests holding it
        finish on it, and its channel closes when the last of them lets go (``Worker.removed``).
        """
        with self._lock:
            self.prefill = self._replace("prefill", self.prefill, prefill, workers_pb2_grpc.PrefillWorkerStub)
            self.decode = self._replace("decode", self.decode, decode, workers_pb2_grpc.DecodeWorkerStub)

    def _replace(self, role: str, current: list[Worker], addresses: list[str], stub_class) -> list[Worker]:
        """The new list for one role (called under the lock)."""
        kept = {worker.address: worker for worker in current}
        wanted = list(dict.fromkeys(addresses))  # order kept, duplicates dropped
        for worker in current:
            if worker.address not in wanted:
                worker.removed = True
                self.prefixes.forget(worker.address)
                self.on_health(worker, None)
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

    @staticmethod
    def _connect(role: str, address: str, stub_class) -> Worker:
        channel = grpc.insecure_channel(address)
        worker = Worker(role=role, address=address, stub=stub_class(channel), channel=channel)
        # Closed once nothing holds the worker: the pool after ``update`` removed it, or a request
        # that was still running on it. (Closing earlier would cancel that request's stream.)
        weakref.finalize(worker, channel.close).atexit = False
        return worker

    def decode_order(self, session_id: str, timeout_s: float) -> list[Worker]:
        """Reachable decode workers in the order to try: the session's own first, then by load."""
        decode = self.decode  # one snapshot: ``update`` may replace the list meanwhile
        loads = [
            ((stats.running, -stats.free_blocks), worker) for worker, stats in self._stats(decode, timeout_s)
        ]
        ordered = [worker for _, worker in sorted(loads, key=lambda pair: pair[0])]
        if session_id and ordered:
            home = decode[zlib.crc32(session_id.encode()) % len(decode)]
            if home in ordered:
                ordered.remove(home)
                ordered.insert(0, home)
        return ordered

    def prefill_order(self, block_hashes: list[int], timeout_s: float) -> list[Worker]:
        """Reachable prefill workers, best first: cached-prefix overlap minus queued prompt tokens.
        Equal scores rotate, so a cold start spreads requests round-robin."""
        ranked = self._stats(self.prefill, timeout_s)
        start = next(self._rotation)
        ranked = ranked[start % len(ranked) :] + ranked[: start % len(ranked)] if ranked else ranked
        with self._lock:
            scores = [
                self.prefixes.match_tokens(worker.address, block_hashes) - stats.queued_prompt_tokens
                for worker, stats in ranked
            ]
        order = sorted(range(len(ranked)), key=lambda i: -scores[i])
        return [ranked[i][0] for i in order]

    def prefilled(self, worker: Worker, block_hashes: list[int]) -> None:
        """``worker`` prefilled a prompt with these block hashes: its cache now likely holds them."""
        with self._lock:
            if not worker.removed:
                self.prefixes.insert(worker.address, block_hashes)

    def check(self, worker: Worker) -> bool:
        """Probe a worker after a failed call; mark it down if it does not answer. Returns ``up``."""
        try:
            worker.stub.Stats(workers_pb2.StatsRequest(), timeout=_PROBE_TIMEOUT_S)
        except grpc.RpcError:
            self.mark_down(worker)
            return False
        return True

    def mark_down(self, worker: Worker) -> None:
        """Skip this worker until a probe answers again; it forgets its cached prefixes."""
        with self._lock:
            if worker.up and not worker.removed:
                self.prefixes.forget(worker.address)  # a restarted worker comes back with an empty cache
            worker.up, worker.down_since = False, time.monotonic()
            self._report(worker, False)

    def _report(self, worker: Worker, up: bool) -> None:
        """``on_health`` for a worker still in the pool (called under the lock, so a removed worker's
        gauge, once dropped, is never set again by a request still finishing on it)."""
        if not worker.removed:
            self.on_health(worker, up)

    def _stats(self, workers: list[Worker], timeout_s: float) -> list[tuple[Worker, object]]:
        """``(worker, WorkerStats)`` of the reachable workers that take new work (not draining). Down
        workers are probed (briefly) once their retry interval has passed."""
        answered = []
        now = time.monotonic()
        for worker in workers:
            if not worker.up and now - worker.down_since < self.probe_interval_s:
                continue
            try:
                stats = worker.stub.Stats(
                    workers_pb2.StatsRequest(), timeout=timeout_s if worker.up else _PROBE_TIMEOUT_S
                )
            except grpc.RpcError:
                self.mark_down(worker)
                continue
            worker.name = stats.worker
            if not worker.up:
                with self._lock:
                    worker.up = True
                    self._report(worker, True)
            if not stats.draining:  # stopping: it finishes its own requests but takes no new one
                answered.append((worker, stats))
        return answered

    def close(self) -> None:
        """Stop probing and close every channel (the router is stopping)."""
        self._stop_probing.set()
        if self._prober is not None:
            self._prober.join(timeout=5)
        for worker in self.prefill + self.decode:
            worker.channel.close()
