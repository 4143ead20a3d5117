"""Frees decode reservations off the gRPC threads, without freeing memory a handoff may still write.

A reservation whose caller went away may have been handed to a prefill worker that is writing into
it right now (NIXL writes are one-sided: decode cannot refuse them). Such a reservation is freed
once that write's notification has arrived, or after ``grace_s`` when none comes (a cancelled prefill
worker stops before writing). A reservation nobody was told about is freed at once.
"""

import threading
import time
from concurrent.futures import Future

from common.errors import TransferError
from services.engine.engine_service import EngineService
from services.transfer.inbox import SharedTransfer

_POLL_S = 0.01  # how often pending reservations look for their handoff's notification


class ReservationReleaser:
    """One thread that frees reservations; ``release`` never blocks (safe in gRPC callbacks).

    Args:
        engine: the decode engine (frees run on its loop, between steps).
        transfer: where handoff notifications arrive.
        grace_s: the longest a reservation waits for an in-flight handoff's notification.
    """

    def __init__(self, engine: EngineService, transfer: SharedTransfer, grace_s: float):
        if not grace_s >= 0:
            raise ValueError(f"release_grace_s: must be >= 0, got {grace_s}")
        self.engine = engine
        self.transfer = transfer
        self.grace_s = grace_s
        self._pending: dict[str, tuple[float, str]] = {}  # request id -> (grace end, notification tag)
        self._changed = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="reservation-releaser", daemon=True)
        self._thread.start()

    def release(
        self, request_id: str, handoff_may_be_in_flight: bool, tag: str | None = None
    ) -> Future | None:
        """Free ``request_id``'s reservation: now (the returned ``Future`` completes once it is freed),
        or once a handoff that may be writing into it has landed (its notification ``tag``, default the
        request id: ``handoff.handoff_tag``) or the grace has passed (None)."""
        if not handoff_may_be_in_flight:
            return self.engine.free_reservation(request_id)
        with self._changed:
            self._pending[request_id] = (time.monotonic() + self.grace_s, tag or request_id)
            self._changed.notify()
        return None

    def pending(self) -> int:
        """Reservations waiting for their handoff's notification or the grace's end."""
        with self._changed:
            return len(self._pending)

    def close(self) -> None:
        with self._changed:
            self._stop = True
            self._changed.notify()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._pending and not self._stop:
                    self._changed.wait()
                if self._stop:
                    return
                pending = list(self._pending.items())
            now = time.monotonic()
            for request_id, (grace_ends, tag) in pending:
                if now >= grace_ends or self._landed(tag):
                    with self._changed:
                        del self._pending[request_id]
                    self.transfer.discard(f"{tag}#")  # earlier parts' notifications (handoff.part_tag)
                    self.engine.free_reservation(request_id)
            with self._changed:
                if self._pending and not self._stop:
                    self._changed.wait(_POLL_S)

    def _landed(self, tag: str) -> bool:
        try:
            self.transfer.wait(tag, 0.0)  # takes the notification if it is there
        except TransferError:
            return False
        return True
