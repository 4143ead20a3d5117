"""The router's view of its prefill and decode workers: stubs, and which one takes the next request."""

import itertools
import threading
import zlib
from dataclasses import dataclass

import grpc

from proto.baton.v1 import workers_pb2, workers_pb2_grpc


@dataclass
class Worker:
    """One worker: its address, name and stub."""

    address: str
    stub: object
    channel: grpc.Channel
    name: str = ""


class WorkerPool:
    """Prefill and decode workers by address.

    Decode workers are tried least-loaded first (``Stats``: running requests, then free blocks); a
    session sticks to the decode worker its id hashes to while that one has room. Prefill workers
    rotate.

    Args:
        prefill: ``host:port`` of each prefill worker.
        decode: ``host:port`` of each decode worker.
    """

    def __init__(self, prefill: list[str], decode: list[str]):
        if not prefill or not decode:
            raise ValueError("workers: the router needs at least one prefill and one decode worker")
        self.prefill = [self._connect(a, workers_pb2_grpc.PrefillWorkerStub) for a in prefill]
        self.decode = [self._connect(a, workers_pb2_grpc.DecodeWorkerStub) for a in decode]
        self._next_prefill = itertools.cycle(range(len(self.prefill)))
        self._lock = threading.Lock()

    @staticmethod
    def _connect(address: str, stub_class) -> Worker:
        channel = grpc.insecure_channel(address)
        return Worker(address=address, stub=stub_class(channel), channel=channel)

    def decode_order(self, session_id: str, timeout_s: float) -> list[Worker]:
        """Decode workers in the order to try: the session's own first, then by load."""
        loads = []
        for worker in self.decode:
            try:
                stats = worker.stub.Stats(workers_pb2.StatsRequest(), timeout=timeout_s)
                worker.name = stats.worker
                loads.append(((stats.running, -stats.free_blocks), worker))
            except grpc.RpcError:
                continue  # an unreachable worker is skipped; the caller reports if none is left
        ordered = [worker for _, worker in sorted(loads, key=lambda pair: pair[0])]
        if session_id and ordered:
            home = self.decode[zlib.crc32(session_id.encode()) % len(self.decode)]
            if home in ordered:
                ordered.remove(home)
                ordered.insert(0, home)
        return ordered

    def next_prefill(self) -> Worker:
        with self._lock:
            return self.prefill[next(self._next_prefill)]

    def close(self) -> None:
        for worker in self.prefill + self.decode:
            worker.channel.close()
