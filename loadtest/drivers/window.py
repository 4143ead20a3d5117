"""One measurement window: the requests sent at one load level, its limits, warm-up and ending.

A window ends by itself in one of four ways (``WindowStats.ended_by``):

- ``workload``: every session it started finished (nothing was left to send);
- ``max_requests``: it sent ``Limits.max_requests`` requests (warm-up included), then waited for the
  ones in flight to finish; sessions sleeping before their next turn are dropped;
- ``duration``: ``Limits.duration_s`` passed (warm-up included). Requests still in flight are
  cancelled (on the server too) and their records discarded: counted in ``cancelled``, neither as
  a success nor as an error, because a request cut short by the load generator says nothing about
  the server (counting it as an error would make every run with long requests look broken);
- ``interrupted``: ``stop()`` (Ctrl-C) — the same cancellation as ``duration``.

Every record gets the window's ``concurrency`` / ``rate``; the first ``warmup_requests`` requests
and those sent within ``warmup_s`` of the window's start are flagged ``warmup``.
"""

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass

from loadtest.clients import Client
from loadtest.records import RequestRecord
from loadtest.workload import Turn

from .progress import Progress


@dataclass(frozen=True)
class Limits:
    """How long each window runs, what counts as warm-up, and how fast workload time passes.

    Attributes:
        duration_s: wall-clock limit per window (each sweep level), warm-up included; None: none.
        max_requests: requests sent per window, warm-up included; None: no limit.
        warmup_requests: the first this many requests of a window are warm-up.
        warmup_s: requests sent within this many seconds of a window's start are warm-up.
        time_scale: divides every wait the workload asks for (``Turn.delay_s``, ``Turn.at_s``),
            as the trace loaders' ``time_scale`` does: 2 runs twice as fast, ``inf`` sends each turn
            as soon as its session is ready.
    """

    duration_s: float | None = None
    max_requests: int | None = None
    warmup_requests: int = 0
    warmup_s: float = 0.0
    time_scale: float = 1.0

    def __post_init__(self):
        checks = (
            ("--duration", self.duration_s is None or self.duration_s > 0, "must be positive"),
            ("--max-requests", self.max_requests is None or self.max_requests > 0, "must be positive"),
            ("--warmup", self.warmup_requests >= 0, "must not be negative"),
            ("--warmup-s", self.warmup_s >= 0, "must not be negative"),
            ("--time-scale", self.time_scale > 0, "must be positive (inf: no waits)"),
        )
        for flag, ok, wording in checks:
            if not ok:
                raise ValueError(f"{flag}: {wording}")

    @property
    def bounded(self) -> bool:
        """Whether a window stops before the workload runs out (then sessions may repeat)."""
        return self.duration_s is not None or self.max_requests is not None


@dataclass(frozen=True)
class WindowStats:
    """What one window did. Times are run-clock seconds; ``measured_start_s`` is when its first
    non-warm-up request was sent (None if there was none)."""

    concurrency: int | None
    rate: float | None
    start_s: float
    end_s: float
    measured_start_s: float | None
    sent: int
    finished: int
    cancelled: int
    ended_by: str

    @property
    def measured_s(self) -> float:
        """The measurement window: first measured request sent -> window end (0 without one)."""
        return 0.0 if self.measured_start_s is None else self.end_s - self.measured_start_s


class Clock:
    """Run-clock seconds: the event loop's time since the clock was made (inside the loop)."""

    def __init__(self):
        self._loop = asyncio.get_running_loop()
        self._origin = self._loop.time()

    def now(self) -> float:
        return self._loop.time() - self._origin


class Window:
    """Sends requests for one level and ends it (see the module docstring for how).

    Args:
        client, clock, limits: as the driver's.
        records: finished requests are appended here (a list shared by the run's windows).
        progress: told about every finished request.
        concurrency, rate: copied onto every record.
    """

    def __init__(
        self,
        client: Client,
        clock: Clock,
        limits: Limits,
        records: list[RequestRecord],
        progress: Progress,
        concurrency: int | None = None,
        rate: float | None = None,
    ):
        self.client, self.clock, self.limits = client, clock, limits
        self.records, self.progress = records, progress
        self.concurrency, self.rate = concurrency, rate
        self.start_s = clock.now()
        self.sent = self.finished = self.inflight = 0
        self.measured_start_s: float | None = None
        self._reason: str | None = None  # set once no more requests may start
        self._end = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()

    @property
    def closed(self) -> bool:
        """No more requests will start in this window."""
        return self._reason is not None

    def stop(self) -> None:
        """End the window now, as the deadline would (Ctrl-C)."""
        self._close("interrupted")
        self._end.set()

    def spawn(self, coroutine: Coroutine) -> asyncio.Task:
        """A task that is cancelled when the window ends."""
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def sleep_until(self, at_s: float) -> None:
        """Sleep until run-clock time ``at_s`` (no-op when it has passed)."""
        wait = at_s - self.clock.now()
        if wait > 0:
            await asyncio.sleep(wait)

    async def send(self, session_id: str, index: int, turn: Turn) -> bool:
        """Send one turn and wait for it; False (nothing sent) once the window is closed."""
        limit = self.limits.max_requests
        if self._reason is not None:
            return False
        self.sent += 1
        self.inflight += 1
        if limit is not None and self.sent >= limit:
            self._close("max_requests")  # this one still goes; later ones do not
        now = self.clock.now()
        warmup = self.sent <= self.limits.warmup_requests or now - self.start_s < self.limits.warmup_s
        if not warmup and self.measured_start_s is None:
            self.measured_start_s = now
        record = RequestRecord(
            session_id=session_id,
            turn=index,
            start_s=now,
            input_tokens=len(turn.prompt_ids),
            concurrency=self.concurrency,
            rate=self.rate,
            warmup=warmup,
        )
        try:
            await self.client.generate(turn.prompt_ids, turn.max_tokens, session_id, record)
        finally:
            self.inflight -= 1  # a cancelled request's record is dropped (see the module docstring)
        self.records.append(record)
        self.finished += 1
        self.progress.update(record)
        if self._reason is not None and self.inflight == 0:
            self._end.set()
        return True

    async def run(self, body: Callable[["Window"], Awaitable[None]]) -> WindowStats:
        """Run ``body(self)`` (which starts sessions and returns when they are done) until the
        window ends; returns its stats. An exception raised by ``body`` is raised here."""
        main = self.spawn(body(self))
        main.add_done_callback(lambda _: self._end.set())
        try:
            await asyncio.wait_for(self._end.wait(), self.limits.duration_s)
        except asyncio.TimeoutError:
            self._reason = "duration"
        end_s, cancelled = self.clock.now(), self.inflight  # before the cancelling, which takes time
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if main.done() and not main.cancelled() and main.exception() is not None:
            raise main.exception()
        return WindowStats(
            concurrency=self.concurrency,
            rate=self.rate,
            start_s=self.start_s,
            end_s=end_s,
            measured_start_s=self.measured_start_s,
            sent=self.sent,
            finished=self.finished,
            cancelled=cancelled,
            ended_by=self._reason or "workload",
        )

    def _close(self, reason: str) -> None:
        if self._reason is None or reason == "interrupted":
            self._reason = reason
