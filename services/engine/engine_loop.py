"""Runs an ``EngineCore`` on its own thread, so servers can talk to it from many threads.

The engine is single-threaded by design (STYLE: state changes only in the call that commits them).
Every change goes through ``call(fn)``, which runs ``fn(engine)`` on the loop thread between steps;
the loop steps the engine while it has work and publishes each request's new tokens to whoever
``watch``es it::

    server threads ── call(reserve / add / abort) ──► [loop thread: commands, then step()] ──► watchers

Between passes it waits for commands: not at all while requests run; ``idle_wait_s`` with none; and
while the only work is a request its prefetch policy holds (``docs/hicache.md``, "Prefetch"), until
that prefetch is over (its handle wakes the loop), the policy's deadline passes, or a command arrives.
"""

import logging
import math
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from .engine_core import EngineCore
from .request import Request, RequestStatus

log = logging.getLogger(__name__)

_WAKE = object()  # queued by a prefetch that ended: only ends the loop's wait


@dataclass(frozen=True)
class RequestDelta:
    """What one request gained in one step; ``finish_reason`` is set on its last delta (finished, or
    held for a handoff)."""

    request_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...]
    finish_reason: str | None
    num_prompt_tokens: int
    num_generated_tokens: int  # all tokens generated so far, these included
    num_cached_tokens: int
    num_cached_tokens_host: int  # of num_cached_tokens, loaded from the host tier
    num_draft_tokens: int = 0  # speculative decoding: drafts verified so far
    num_accepted_draft_tokens: int = 0  # of those, accepted into the output


class EngineLoop:
    """A background thread owning one engine.

    Args:
        engine: the engine; from now on only the loop thread touches it.
        idle_wait_s: how long the idle loop sleeps before looking for work again.
        after_step: called on the loop thread after every pass and every command (metrics gauges
            and the stats snapshot read the pools here).
    """

    def __init__(
        self,
        engine: EngineCore,
        idle_wait_s: float = 0.05,
        after_step: Callable[[EngineCore], None] | None = None,
    ):
        self.engine = engine
        self.after_step = after_step
        self.idle_wait_s = idle_wait_s
        self._commands: queue.Queue = queue.Queue()
        self._watchers: dict[str, queue.Queue] = {}
        self._sent: dict[str, int] = {}  # tokens already published per watched request
        self._watched: dict[str, Request] = {}
        self._stop = threading.Event()
        engine.cache.prefetch_gate.on_prefetch_done(lambda: self._commands.put(_WAKE))
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    def call(
        self, fn: Callable[[EngineCore], Any], timeout_s: float | None = 600.0, read_only: bool = False
    ) -> Any:
        """Run ``fn(engine)`` on the loop thread and return its result (or raise its exception).
        ``read_only``: ``fn`` changes nothing ``after_step`` reports, so it is not called after it."""
        return self.submit(fn, read_only).result(timeout=timeout_s)

    def submit(self, fn: Callable[[EngineCore], Any], read_only: bool = False) -> Future:
        """Queue ``fn(engine)`` for the loop thread and return at once (its ``Future`` holds the result;
        ``read_only`` as in ``call``).

        For callers that must not wait for a running step: gRPC cancellation callbacks run on the
        server's event thread, where a wait would stall every other call of the process."""
        future: Future = Future()
        self._commands.put((fn, future, read_only))
        return future

    def watch(self, request: Request) -> "queue.Queue[RequestDelta]":
        """Deltas of ``request`` from now on (call from the loop thread, inside ``call``)."""
        stream: queue.Queue = queue.Queue()
        self._watchers[request.request_id] = stream
        self._sent[request.request_id] = 0
        self._watched[request.request_id] = request
        return stream

    def close(self) -> None:
        self._stop.set()
        self._commands.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        scheduler = self.engine.scheduler
        while not self._stop.is_set():
            self._drain_commands(self._wait_s())
            try:
                if scheduler.waiting or scheduler.running:
                    self.engine.step()
            except Exception:  # a failed step must not stop the server: fail its requests instead
                log.exception("engine step failed; aborting the requests it carried")
                for request in list(scheduler.waiting) + list(scheduler.running):
                    self.engine.abort(request.request_id)
            self._publish()
            if self.after_step is not None:
                self.after_step(self.engine)

    def _wait_s(self) -> float:
        """How long to wait for a command before the next pass (``math.inf``: until one comes)."""
        scheduler = self.engine.scheduler
        if scheduler.running:
            return 0.0
        if not scheduler.waiting:
            return self.idle_wait_s
        held = self.engine.cache.prefetch_hold_s(scheduler.waiting[0])  # the queue keeps arrival order
        return 0.0 if held is None else held

    def _drain_commands(self, wait_s: float) -> None:
        try:
            if wait_s <= 0:
                item = self._commands.get_nowait()
            else:
                item = self._commands.get(timeout=None if math.isinf(wait_s) else wait_s)
        except queue.Empty:
            return
        while item is not None:
            if item is not _WAKE:
                self._run_command(*item)
            try:
                item = self._commands.get_nowait()
            except queue.Empty:
                return

    def _run_command(self, fn: Callable[[EngineCore], Any], future: Future, read_only: bool) -> None:
        if future.set_running_or_notify_cancel():
            try:
                result = fn(self.engine)
                if self.after_step is not None and not read_only:  # observers see its effect at once
                    self.after_step(self.engine)
                future.set_result(result)
            except Exception as error:  # handed to the caller, who maps it to a status
                future.set_exception(error)

    def _publish(self) -> None:
        for request_id, stream in list(self._watchers.items()):
            request = self._watched[request_id]
            sent = self._sent[request_id]
            finished = request.status in (RequestStatus.FINISHED, RequestStatus.HELD)
            if len(request.output_ids) == sent and not finished:
                continue
            stream.put(
                RequestDelta(
                    request_id=request_id,
                    token_ids=tuple(request.output_ids[sent:]),
                    logprobs=tuple(request.logprobs[sent:]),
                    top_logprobs=tuple(tuple(t) for t in request.top_logprobs[sent:]),
                    finish_reason=request.finish_reason.value if finished and request.finish_reason else None,
                    num_prompt_tokens=len(request.prompt_ids),
                    num_generated_tokens=len(request.output_ids),
                    num_cached_tokens=request.num_cached_tokens,
                    num_cached_tokens_host=request.num_cached_tokens_host,
                    num_draft_tokens=request.num_draft_tokens,
                    num_accepted_draft_tokens=request.num_accepted_draft_tokens,
                )
            )
            self._sent[request_id] = len(request.output_ids)
            if finished:
                del self._watchers[request_id], self._sent[request_id], self._watched[request_id]
