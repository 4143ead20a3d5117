"""After the clients are gone: does every worker give back every block, slot and request, and how fast?

Polls each worker's ``CheckIntegrity`` until none holds anything (blocks referenced by a request,
KDA state slots, running / waiting / reserved / held requests) and every pool is consistent, or
until the bound. Blocks kept only for prefix reuse (``cached_blocks``) are not held.
"""

import time
from dataclasses import dataclass

import grpc

from deploy.local.launcher import ManagedWorker
from proto.baton.v1 import workers_pb2, workers_pb2_grpc

_POLL_S = 0.1


@dataclass(frozen=True)
class WorkerHeld:
    """One worker's ``PoolIntegrity`` at the last poll (``error`` also says when it did not answer)."""

    worker: str
    role: str
    ok: bool
    error: str
    used_blocks: int
    used_slots: int
    running: int
    waiting: int
    reserved: int
    held: int
    request_ids: tuple[str, ...]

    @property
    def clean(self) -> bool:
        """Consistent pools and nothing held."""
        return self.ok and not (
            self.used_blocks or self.used_slots or self.running or self.waiting or self.reserved or self.held
        )


@dataclass(frozen=True)
class LeakCheck:
    """``seconds``: from the last client's end (or the last killed worker's restart, if later) until every
    worker was clean (None: not by the bound)."""

    bound_s: float
    seconds: float | None
    workers: tuple[WorkerHeld, ...]

    @property
    def clean(self) -> bool:
        return self.seconds is not None

    def total(self, field: str) -> int:
        """Sum of ``field`` (``used_blocks``, ``used_slots``, ...) over the workers at the last poll."""
        return sum(getattr(worker, field) for worker in self.workers)

    @property
    def leaked_requests(self) -> int:
        """Requests some worker still knew at the last poll."""
        return sum(w.running + w.waiting + w.reserved + w.held for w in self.workers)


def wait_until_released(workers: list[ManagedWorker], since: float, bound_s: float) -> LeakCheck:
    """Poll ``workers`` until all are clean or ``bound_s`` after ``since`` (a ``time.monotonic()``)."""
    channels = [worker.channel() for worker in workers]  # with the cluster's secret, if it has one
    stubs = [
        (workers_pb2_grpc.DecodeWorkerStub if w.role == "decode" else workers_pb2_grpc.PrefillWorkerStub)(c)
        for w, c in zip(workers, channels, strict=True)
    ]
    try:
        while True:
            held = tuple(_integrity(worker, stub) for worker, stub in zip(workers, stubs, strict=True))
            now = time.monotonic()
            if all(worker.clean for worker in held):
                return LeakCheck(bound_s, max(0.0, now - since), held)
            if now - since >= bound_s:
                return LeakCheck(bound_s, None, held)
            time.sleep(_POLL_S)
    finally:
        for channel in channels:
            channel.close()


def _integrity(worker: ManagedWorker, stub) -> WorkerHeld:
    try:
        reply = stub.CheckIntegrity(workers_pb2.IntegrityRequest(), timeout=5)
    except grpc.RpcError as error:
        return WorkerHeld(
            worker.name, worker.role, False, f"no answer: {error.code().name}", 0, 0, 0, 0, 0, 0, ()
        )
    return WorkerHeld(
        worker=worker.name,
        role=worker.role,
        ok=reply.ok,
        error=reply.error,
        used_blocks=reply.used_blocks,
        used_slots=reply.used_slots,
        running=reply.running,
        waiting=reply.waiting,
        reserved=reply.reserved,
        held=reply.held,
        request_ids=tuple(reply.request_ids),
    )
