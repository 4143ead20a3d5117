"""One worker's ``WatchLoad`` stream, kept open by a thread: reconnected with backoff, cancelled on demand.

    connect ──► full picture ──► updates / keepalives ... ──► broken (error, end, restart) ──► wait ──┐
       ▲                                                                                              │
       └──────────────────────────── backoff: 0.05 s doubling to retry_max_s ◄────────────────────────┘

What a message means is the pool's business (``on_message``, ``on_broken``); this only keeps the
stream and remembers when it last heard from the worker, so a silent one can be cut off (``silent``).
"""

import logging
import threading
import time
from collections.abc import Callable

import grpc

from proto.baton.v1 import workers_pb2

log = logging.getLogger(__name__)
_FIRST_RETRY_S = 0.05


class LoadWatcher:
    """Watches one worker's load feed on a daemon thread from construction until ``stop``.

    Args:
        address: the worker (for logs).
        stub: its ``DecodeWorkerStub`` or ``PrefillWorkerStub``.
        on_message: ``(update)`` for every message, on the watcher's thread (the first of each stream is
            a full picture).
        on_broken: ``()`` when a stream that was open (or the attempt to open one) ends.
        retry_max_s: the longest wait between two connection attempts.
    """

    def __init__(
        self,
        address: str,
        stub,
        on_message: Callable[[workers_pb2.LoadUpdate], None],
        on_broken: Callable[[], None],
        retry_max_s: float = 1.0,
    ):
        self.address = address
        self._stub = stub
        self._on_message = on_message
        self._on_broken = on_broken
        self.retry_max_s = max(retry_max_s, _FIRST_RETRY_S)
        self.settled = threading.Event()  # the first attempt has answered or failed
        self.heard_at = time.monotonic()
        self._streaming = False
        self._call = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"load-watch-{address}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        backoff = _FIRST_RETRY_S
        while not self._stop.is_set():
            call = self._stub.WatchLoad(workers_pb2.WatchLoadRequest())
            with self._lock:
                if self._stop.is_set():
                    call.cancel()
                    return
                self._call = call
            answered = False
            try:
                for update in call:
                    self.heard_at = time.monotonic()
                    self._streaming = answered = True
                    on_message = self._on_message
                    if on_message is None:  # stopped while this message arrived
                        return
                    on_message(update)
                    self.settled.set()
            except grpc.RpcError as error:
                if not self._stop.is_set() and error.code() != grpc.StatusCode.CANCELLED:
                    log.debug("load feed of %s broke: %s", self.address, error.code())
            self._streaming = False
            if not self._stop.is_set():
                self._on_broken()
            self.settled.set()
            backoff = _FIRST_RETRY_S if answered else min(2 * backoff, self.retry_max_s)
            self._stop.wait(backoff)

    def silent(self, now: float, silence_s: float) -> bool:
        """Whether an open stream has said nothing (not even a keepalive) for ``silence_s``."""
        return self._streaming and now - self.heard_at > silence_s

    def restart(self) -> None:
        """Cut the current stream (the worker was marked down, or went silent); the thread reconnects."""
        with self._lock:
            if self._call is not None:
                self._call.cancel()

    def stop(self, timeout_s: float = 2.0) -> None:
        """End the stream and the thread (waits up to ``timeout_s`` for it)."""
        self._stop.set()
        self.restart()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
        # The pool's callbacks hold the Worker, whose channel closes only once nothing does.
        self._on_message = self._on_broken = None
        self._stub = None
