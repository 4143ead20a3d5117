"""A worker's graceful stop (SIGTERM): admit nothing new, finish what is in flight, then go.

    SIGTERM ─▶ draining: health NOT_SERVING, WorkerStats.draining, new work refused (UNAVAILABLE)
            ─▶ wait: running streams, reservations whose state is arriving, handoffs being written
            ─▶ idle, or the grace period over: streams still running end with UNAVAILABLE
               (the router moves them to another decode worker: router/migration.py) ─▶ exit 0

The router treats a refusal as "try another worker" and skips a worker whose stats say draining.
What is in flight is read from the engine (waiting, running, reserved and held requests), plus the
calls that passed the admission check but have not reached the engine yet.
"""

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from common.errors import TransferError


class Draining(TransferError):
    """This worker is stopping and takes no new work (UNAVAILABLE: the router tries another)."""


class Drain:
    """Admission gate and stop state of one worker, shared by its servicers and its server.

    Args:
        name: the worker's name, for error messages.
    """

    def __init__(self, name: str):
        self.name = name
        self._lock = threading.Lock()
        self._admitting = 0  # calls between their admission check and the engine
        self._draining = False
        self._expired = threading.Event()

    @contextmanager
    def admit(self, what: str) -> Iterator[None]:
        """Hold around the call that hands new work to the engine (a reserve, a prefill).

        Raises:
            Draining: the worker is draining; ``what`` names the refused call.
        """
        with self._lock:
            if self._draining:
                raise Draining(f"{self.name} is draining (shutting down): {what} refused; try another worker")
            self._admitting += 1
        try:
            yield
        finally:
            with self._lock:
                self._admitting -= 1

    def start(self) -> None:
        """Refuse new work from now on (admissions already past the check still complete)."""
        with self._lock:
            self._draining = True

    @property
    def admitting(self) -> bool:
        """Whether a call that was admitted has not yet handed its work to the engine."""
        with self._lock:
            return self._admitting > 0

    def expire(self) -> None:
        """The grace period is over: running streams end now (``check_expired``)."""
        self._expired.set()

    def check_expired(self, request_id: str) -> None:
        """Called by a running stream between messages.

        Raises:
            Draining: the grace period is over; the router moves the request elsewhere.
        """
        if self._expired.is_set():
            raise Draining(f"{self.name} stopped after its grace period; request {request_id!r} must move")
