"""Admission control: at most ``max_running`` requests in flight, at most ``max_queued`` waiting."""

import threading

from common.errors import NoCapacity
from common.metrics import Metrics

_RECHECK_FIRST_S = 0.05  # a request waiting for decode room looks again after this, doubling...
_RECHECK_MAX_S = 1.0  # ...up to this (room can free without a request leaving here: other routers)


class Admission:
    """A bounded queue in front of the workers.

    ``enter`` waits (up to the request's deadline) for a running seat; when ``max_queued`` requests
    are already waiting it refuses at once with ``NoCapacity`` (RESOURCE_EXHAUSTED / HTTP 429).
    An admitted request that finds every decode worker full waits in the same queue
    (``wait_for_capacity``) instead of failing, keeping its seat.
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
        self._left = threading.Condition(self._lock)  # a request left: decode room may have freed
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

    def wait_for_capacity(self, timeout_s: float | None, waited_s: float = 0.0) -> None:
        """Wait, counted as queued, until a request leaves or a recheck interval passes (growing with
        ``waited_s``, the time this request has waited so far); then the caller tries again.

        Raises:
            NoCapacity: the queue is full (``max_queued``): RESOURCE_EXHAUSTED / HTTP 429.
            TimeoutError: the request's deadline has passed.
        """
        if timeout_s is not None and timeout_s <= 0:
            raise TimeoutError("deadline passed while waiting for room on a decode worker")
        pause = min(_RECHECK_MAX_S, max(_RECHECK_FIRST_S, waited_s))
        with self._lock:
            if self._queued >= self.max_queued:
                raise NoCapacity(
                    f"every decode worker is full, and so is the router queue ({self._queued} waiting)"
                )
            self._queued += 1
            self._set_queued()
            try:
                self._left.wait(pause if timeout_s is None else min(pause, timeout_s))
            finally:
                self._queued -= 1
                self._set_queued()

    def leave(self) -> None:
        self._inflight(-1)
        self._seats.release()
        with self._lock:
            self._left.notify()  # one waiter for decode room tries again (not a stampede)

    def _inflight(self, change: int) -> None:
        if self.metrics is not None:
            self.metrics.router_inflight.inc(change)

    def _set_queued(self) -> None:  # under self._lock, so the gauge never goes out of order
        if self.metrics is not None:
            self.metrics.router_queued.set(self._queued)
