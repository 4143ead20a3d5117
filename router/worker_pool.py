"""The router's view of its prefill and decode workers: stubs, health, and which one takes a request."""

import itertools
import threading
import time
import zlib
from dataclasses import dataclass

import grpc

from proto.baton.v1 import workers_pb2, workers_pb2_grpc

from .prefix_index import PrefixIndex

_PROBE_TIMEOUT_S = 0.5


@dataclass
class Worker:
    """One worker: its role, address, name (from its stats) and stub; ``up`` is the router's view."""

    role: str
    address: str
    stub: object
    channel: grpc.Channel
    name: str = ""
    up: bool = True
    down_since: float = 0.0


class WorkerPool:
    """Prefill and decode workers by address.

    Decode workers are tried least-loaded first (``Stats``: running requests, then free blocks); a
    session sticks to the decode worker its id hashes to while that one has room. Prefill workers
    are ranked by the prompt tokens they probably hold in their prefix cache (``PrefixIndex``) minus
    the prompt tokens already queued on them, so a shared prefix goes back where it is cached unless
    that worker is busier than the hit is worth.

    A worker that fails is marked down (``mark_down``) and skipped; it is probed again every
    ``probe_interval_s`` and comes back when its ``Stats`` answers.

    Args:
        prefill: ``host:port`` of each prefill worker (none: decode workers prefill everything).
        decode: ``host:port`` of each decode worker.
        on_health: called with ``(worker, up)`` whenever a worker's state changes (metrics).
    """

    def __init__(
        self,
        prefill: list[str],
        decode: list[str],
        on_health=None,
        probe_interval_s: float = 1.0,
    ):
        if not decode:
            raise ValueError("workers: the router needs at least one decode worker")
        self.prefill = [self._connect("prefill", a, workers_pb2_grpc.PrefillWorkerStub) for a in prefill]
        self.decode = [self._connect("decode", a, workers_pb2_grpc.DecodeWorkerStub) for a in decode]
        self.on_health = on_health or (lambda worker, up: None)
        self.probe_interval_s = probe_interval_s
        self.prefixes = PrefixIndex()
        self._rotation = itertools.count()
        self._lock = threading.Lock()
        for worker in self.prefill + self.decode:
            self.on_health(worker, True)

    @staticmethod
    def _connect(role: str, address: str, stub_class) -> Worker:
        channel = grpc.insecure_channel(address)
        return Worker(role=role, address=address, stub=stub_class(channel), channel=channel)

    def decode_order(self, session_id: str, timeout_s: float) -> list[Worker]:
        """Reachable decode workers in the order to try: the session's own first, then by load."""
        loads = [
            ((stats.running, -stats.free_blocks), worker)
            for worker, stats in self._stats(self.decode, timeout_s)
        ]
        ordered = [worker for _, worker in sorted(loads, key=lambda pair: pair[0])]
        if session_id and ordered:
            home = self.decode[zlib.crc32(session_id.encode()) % len(self.decode)]
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
        with self._lock:
            if worker.up:
                self.prefixes.forget(worker.address)  # a restarted worker comes back with an empty cache
            worker.up, worker.down_since = False, time.monotonic()
        self.on_health(worker, False)

    def _stats(self, workers: list[Worker], timeout_s: float) -> list[tuple[Worker, object]]:
        """``(worker, WorkerStats)`` of the reachable workers. Down workers are probed (briefly) once
        their retry interval has passed."""
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
                worker.up = True
                self.on_health(worker, True)
            answered.append((worker, stats))
        return answered

    def close(self) -> None:
        for worker in self.prefill + self.decode:
            worker.channel.close()
