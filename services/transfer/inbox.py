"""Access to one transfer backend from many server threads, with handoffs running in parallel.

``SharedTransfer`` lets any number of handler threads write at once: writes tagged with different
request ids (different reservations) proceed in parallel, two tagged with the same id run one after
the other. A poller thread collects incoming notifications so any thread can wait for its own.

Why that is safe, state by state:

- The peer table and the regions (``TransferBackend._peers``, ``_regions``) change only in
  ``endpoint`` / ``connect`` / ``close``, which take ``_setup_lock`` here; a ``write`` only reads
  them. (A reconnect that replaced a peer mid-write would race it, but ``connect`` replaces a peer only
  when its endpoint changed under the same agent name, and agent names are random per process.)
- ``poll_notifications`` (and the backend's pending list) is called by the poller thread alone.
- NIXL: the agent runs without its own locking (``NIXL_THREAD_SYNC_NONE``), so ``NixlBackend`` holds
  its agent lock around each call into the agent (post a transfer, check its state, release it: each
  microseconds) and never across the wait for a transfer to complete; UCX moves the bytes of every
  posted transfer meanwhile.
- gRPC bytes: a channel and its stub are thread-safe, each write is its own ``WriteRows`` call, and
  the receiver's sink copies each call's chunks into that call's rows.
"""

import threading
import time
from contextlib import contextmanager

from common.errors import TransferError

from .backend import TransferBackend, TransferStats
from .endpoint import TransferEndpoint


class SharedTransfer:
    """One backend, shared by a server's handler threads.

    Args:
        backend: the backend (its pools already registered).
        poll_interval_s: how often the poller looks for notifications.
        stale_after_s: a notification nobody has waited for this long is dropped (its reservation is
            gone: a caller that left, a stray write), so a long-running worker does not keep them all.
    """

    def __init__(
        self, backend: TransferBackend, poll_interval_s: float = 0.001, stale_after_s: float = 1200.0
    ):
        self.backend = backend
        self.name = backend.name
        self._setup_lock = threading.Lock()  # endpoint, peers, close
        self._writing: dict[str, tuple[threading.Lock, int]] = {}  # request id -> (its lock, users)
        self._writing_lock = threading.Lock()
        self._arrived: dict[str, list[str]] = {}  # message -> the agents that sent it
        self._arrived_at: dict[str, float] = {}  # message -> when it first arrived (monotonic)
        self._stale_after_s = stale_after_s
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._poll_interval_s = poll_interval_s
        self._poller = threading.Thread(target=self._poll, name="transfer-inbox", daemon=True)
        self._poller.start()

    def endpoint(self) -> TransferEndpoint:
        with self._setup_lock:
            return self.backend.endpoint()

    def connect(self, endpoint: TransferEndpoint) -> str:
        with self._setup_lock:
            return self.backend.connect(endpoint)

    def write(self, peer: str, rows: dict, message: str, timeout_s: float = 30.0) -> TransferStats:
        """``TransferBackend.write``, in parallel with writes of other requests (``message``)."""
        with self._one_writer(message):
            return self.backend.write(peer, rows, message=message, timeout_s=timeout_s)

    def wait(self, message: str, timeout_s: float) -> list[str]:
        """Block until a notification carrying ``message`` has arrived (then forget it).

        Returns:
            The agent names that sent ``message``, in arrival order (one for an honest handoff).

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
            self._arrived_at.pop(message, None)
            return self._arrived.pop(message)

    def discard(self, prefix: str) -> None:
        """Forget notifications whose message starts with ``prefix`` (those of a handoff nobody will
        wait for any more)."""
        with self._changed:
            for message in [message for message in self._arrived if message.startswith(prefix)]:
                del self._arrived[message], self._arrived_at[message]

    def close(self) -> None:
        self._stop.set()
        self._poller.join(timeout=5)
        with self._setup_lock:
            self.backend.close()

    @contextmanager
    def _one_writer(self, message: str):
        """Hold ``message``'s own lock: writes of one request never overlap, others are not held up."""
        with self._writing_lock:
            lock, users = self._writing.get(message, (threading.Lock(), 0))
            self._writing[message] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._writing_lock:
                lock, users = self._writing[message]
                if users == 1:
                    del self._writing[message]
                else:
                    self._writing[message] = (lock, users - 1)

    def _poll(self) -> None:
        purged_at = time.monotonic()
        while not self._stop.is_set():
            arrived = self.backend.poll_notifications()
            now = time.monotonic()
            if arrived:
                with self._changed:
                    for notification in arrived:
                        self._arrived.setdefault(notification.message, []).append(notification.peer)
                        self._arrived_at.setdefault(notification.message, now)
                    self._changed.notify_all()
            else:
                time.sleep(self._poll_interval_s)
            if now - purged_at >= min(60.0, self._stale_after_s):
                purged_at = now
                self._drop_stale(now)

    def _drop_stale(self, now: float) -> None:
        with self._changed:
            stale = [message for message, at in self._arrived_at.items() if now - at >= self._stale_after_s]
            for message in stale:
                del self._arrived[message], self._arrived_at[message]
