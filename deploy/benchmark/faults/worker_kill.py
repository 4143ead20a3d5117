"""SIGKILL a launcher-managed worker and watch it come back: when the router saw it down, when the
launcher's restart answered health SERVING.

``KillInjector`` fires a scenario's kills as the clients' finished-request count crosses each
threshold, one at a time (the next waits for the previous worker's recovery, so a role never loses
all its workers at once); ``kill_and_watch`` is one kill, usable on its own (e.g. on an idle cluster).
"""

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from deploy.local.launcher import LocalCluster, ManagedWorker

from .router_metrics import worker_up

_POLL_S = 0.05


@dataclass(frozen=True)
class KillRecord:
    """One SIGKILL. Seconds are from the kill; None: it did not happen within the watch.

    ``reported_down_s``: the router's ``baton_worker_up`` for the worker read 0.
    ``restarted_s``: the restarted process answered gRPC health SERVING on the same port.
    """

    role: str
    worker: str  # its name (decode routes name it so)
    address: str  # host:port (prefill routes name it so)
    pid: int
    killed_at: float  # time.monotonic()
    reported_down_s: float | None
    restarted_s: float | None


def kill_and_watch(worker: ManagedWorker, metrics_url: str, timeout_s: float = 300.0) -> KillRecord:
    """SIGKILL ``worker``'s process, then watch until the launcher's restart is SERVING."""
    process = worker.process
    pid = process.pid
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    process.wait(timeout=30)
    reported_down = restarted = None
    with grpc.insecure_channel(worker.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while restarted is None and time.monotonic() - killed_at < timeout_s:
            now = time.monotonic()
            if reported_down is None and worker_up(metrics_url, worker.role, worker.address) == 0:
                reported_down = now - killed_at
            if worker.process is not process and serving(health):
                restarted = time.monotonic() - killed_at
            time.sleep(_POLL_S)
    return KillRecord(worker.role, worker.name, worker.address, pid, killed_at, reported_down, restarted)


def serving(health) -> bool:
    """Whether the process behind ``health`` (a gRPC health stub) answers SERVING now."""
    try:
        reply = health.Check(health_pb2.HealthCheckRequest(), timeout=0.5)
    except grpc.RpcError:
        return False  # the new process is not listening yet
    return reply.status == health_pb2.HealthCheckResponse.SERVING


class KillInjector:
    """Fires ``schedule`` (``(finished requests, role)`` pairs) on ``cluster`` as ``finished()`` (the
    clients' count of ended requests) grows; kill ``i`` of a role takes that role's worker ``i mod n``.
    ``join()`` waits for the last recovery and returns the records."""

    def __init__(
        self,
        cluster: LocalCluster,
        schedule: list[tuple[int, str]],
        finished: Callable[[], int],
        metrics_url: str,
    ):
        self._cluster, self._schedule, self._finished = cluster, schedule, finished
        self._metrics_url = metrics_url
        self._stop = threading.Event()
        self.records: list[KillRecord] = []
        self.error: Exception | None = None
        self._thread = threading.Thread(target=self._run, name="kill-injector", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        fired = {"prefill": 0, "decode": 0}
        try:
            for threshold, role in self._schedule:
                while self._finished() < threshold:
                    if self._stop.wait(_POLL_S):
                        return
                workers = [w for w in self._cluster.workers if w.role == role]
                worker = workers[fired[role] % len(workers)]
                fired[role] += 1
                self.records.append(kill_and_watch(worker, self._metrics_url))
        except Exception as error:  # surfaced by join(): a kill that could not be made or watched
            self.error = error

    def join(self, timeout_s: float = 600.0) -> list[KillRecord]:
        """Wait for every scheduled kill and its recovery.

        Raises:
            RuntimeError: a kill failed, or the kills did not finish in ``timeout_s``.
        """
        self._thread.join(timeout=timeout_s)
        if self._thread.is_alive():
            self._stop.set()
            raise RuntimeError(f"the scheduled kills did not finish in {timeout_s:.0f} s")
        if self.error is not None:
            raise RuntimeError(f"a scheduled kill failed: {self.error!r}") from self.error
        return list(self.records)

    def cancel(self) -> None:
        """Fire no further kill (the traffic failed)."""
        self._stop.set()
