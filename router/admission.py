"""Admission control: at most ``max_running`` requests in flight, at most ``max_queued`` waiting."""

import threading

from services.engine.scheduler import NoCapacity


class Admission:
    """A bounded queue in front of the workers.

    ``enter`` waits (up to the request's deadline) for a running seat; when ``max_queued`` requests
    are already waiting it refuses at once with ``NoCapacity`` (RESOURCE_EXHAUSTED / HTTP 429).
    """

    def __init__(self, max_running: int, max_queued: int):
        if max_running < 1 or max_queued < 0:
            raise ValueError("max_running: must be >= 1 and max_queued >= 0")
        self.max_queued = max_queued
        self._seats = threading.Semaphore(max_running)
        self._lock = threading.Lock()
        self._queued = 0

    def enter(self, timeout_s: float | None) -> None:
        """Take a running seat. Raises NoCapacity (queue full) or TimeoutError (deadline while queued)."""
        if self._seats.acquire(blocking=False):
            return
        with self._lock:
            if self._queued >= self.max_queued:
                raise NoCapacity(f"router queue full ({self._queued} waiting); retry later")
            self._queued += 1
        try:
            admitted = self._seats.acquire(timeout=timeout_s)
        finally:
            with self._lock:
                self._queued -= 1
        if not admitted:
            raise TimeoutError("deadline passed while waiting in the router queue")

    def leave(self) -> None:
        self._seats.release()
