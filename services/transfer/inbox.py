"""Thread-safe access to a transfer backend from many server threads.

A ``TransferBackend`` is for one thread. ``SharedTransfer`` serialises calls with a lock, and a
poller thread collects incoming notifications so any number of threads can wait for their own.
"""

import threading
import time

from common.errors import TransferError

from .backend import TransferBackend, TransferStats
from .endpoint import TransferEndpoint


class SharedTransfer:
    """One backend, shared by a server's handler threads.

    Args:
        backend: the backend (its pools already registered).
        poll_interval_s: how often the poller looks for notifications.
    """

    def __init__(self, backend: TransferBackend, poll_interval_s: float = 0.001):
        self.backend = backend
        self.name = backend.name
        self._lock = threading.Lock()
        self._arrived: set[str] = set()
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._poll_interval_s = poll_interval_s
        self._poller = threading.Thread(target=self._poll, name="transfer-inbox", daemon=True)
        self._poller.start()

    def endpoint(self) -> TransferEndpoint:
        with self._lock:
            return self.backend.endpoint()

    def connect(self, endpoint: TransferEndpoint) -> str:
        with self._lock:
            return self.backend.connect(endpoint)

    def write(self, peer: str, rows: dict, message: str, timeout_s: float = 30.0) -> TransferStats:
        with self._lock:
            return self.backend.write(peer, rows, message=message, timeout_s=timeout_s)

    def wait(self, message: str, timeout_s: float) -> None:
        """Block until a notification carrying ``message`` has arrived (then forget it).

        Raises:
            TransferError: none arrived within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while message not in self._arrived:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TransferError(f"no transfer for request {message!r} within {timeout_s:.1f} s")
                self._changed.wait(left)
            self._arrived.discard(message)

    def close(self) -> None:
        self._stop.set()
        self._poller.join(timeout=5)
        with self._lock:
            self.backend.close()

    def _poll(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                arrived = self.backend.poll_notifications()
            if arrived:
                with self._changed:
                    self._arrived.update(n.message for n in arrived)
                    self._changed.notify_all()
            else:
                time.sleep(self._poll_interval_s)
