"""Admission control: at most ``max_running`` requests in flight, at most ``max_queued`` waiting."""

import threading

from services.engine.scheduler import NoCapacity
from services.metrics import Metrics


class Admission:
    """A bounded queue in front of the workers.

    ``enter`` waits (up to the request's deadline) for a running seat; when ``max_queued`` requests
    are already waiting it refuses at once with ``NoCapacity`` (RESOURCE_EXHAUSTED / HTTP 429).
    With ``metrics``, the ``baton_router_{queued,inflight}_requests`` gauges and their limits follow.
    """

    def __init__(self, max_running: int, max_queued: int, metrics: Metrics | None = None):
        if max_running < 1 or max_queued < 0:
            raise ValueError("max_running: must be >= 1 and max_queued >= 0")
        self.max_queued = max_queued
        self.metrics = metrics
        self._seats = threading.Semaphore(max_running)
        self._lock = threading.Lock()
        self._queued = 0
        if metrics is not None:
            metrics.router_inflight_limit.set(max_running)
            metrics.router_queued_limit.set(max_queued)

    def enter(self, timeout_s: float | None) -> None:
        """Take a running seat. Raises NoCapacity (queue full) or TimeoutError (deadline while queued)."""
        if self._seats.acquire(blocking=False):
            self._inflight(+1)
            return
        with self._lock:
            if self._queued >= self.max_queued:
                raise NoCapacity(f"router queue full ({self._queued} waiting); retry later")
            self._queued += 1
            self._set_queued()
        try:
            admitted = self._seats.acquire(timeout=timeout_s)
        finally:
            with self._lock:
                self._queued -= 1
                self._set_queued()
        if not admitted:
            raise TimeoutError("deadline passed while waiting in the router queue")
        self._inflight(+1)

    def leave(self) -> None:
        self._inflight(-1)
        self._seats.release()

    def _inflight(self, change: int) -> None:
        if self.metrics is not None:
            self.metrics.router_inflight.inc(change)

    def _set_queued(self) -> None:  # under self._lock, so the gauge never goes out of order
        if self.metrics is not None:
            self.metrics.router_queued.set(self._queued)
