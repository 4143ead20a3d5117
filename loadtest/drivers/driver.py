"""What every driver shares: the run loop over windows, where sessions come from, and how one
session's turns (and its subagents) are sent.

A session runs its turns one after another. Before each turn it waits until the turn's start time
(``Pace``: after the previous turn plus ``delay_s``, or a replayed timestamp); turn 0 waits from the
session's start. A turn's ``subagents`` start together when the turn finishes, and the session's
next turn waits until all of them are done (an agent waiting on the subagents it spawned).
"""

import abc
import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from loadtest.clients import Client
from loadtest.records import RequestRecord
from loadtest.workload import Session, Turn, Workload

from .progress import Progress
from .window import Clock, Limits, Window, WindowStats

# (turn, when its session started, when its previous turn (and subagents) finished) -> start time
Pace = Callable[[Turn, float, float], float]


@dataclass
class RunResult:
    """A run's finished requests (in order of finishing) and what each window did."""

    records: list[RequestRecord] = field(default_factory=list)
    windows: list[WindowStats] = field(default_factory=list)

    @property
    def measured_s(self) -> float:
        """Seconds of measurement, summed over windows (the ``duration_s`` of the report)."""
        return sum(window.measured_s for window in self.windows)

    @property
    def cancelled(self) -> int:
        """Requests in flight at a deadline or Ctrl-C: cancelled, without a record."""
        return sum(window.cancelled for window in self.windows)

    @property
    def interrupted(self) -> bool:
        return any(window.ended_by == "interrupted" for window in self.windows)


class SessionSource:
    """The workload's sessions in order, shared by a run's windows (a sweep level continues where
    the previous one stopped, so it does not find its prompts already cached).

    With ``cycle`` (a run bounded by duration or request count) the sessions start over when they
    run out, with ``~2``, ``~3``, ... appended to every session id of the repeat (subagents too), so
    affinity and per-session metrics keep them apart; ``repeats`` counts the restarts. Repeated
    sessions send the same prompts, so they find them in the server's prefix cache.
    """

    def __init__(self, sessions: Sequence[Session], cycle: bool):
        self.sessions, self.cycle = tuple(sessions), cycle
        self.repeats = 0
        self._next = 0

    def next(self) -> Session | None:
        """The next session, or None when the workload is used up."""
        if self._next == len(self.sessions):
            if not self.cycle or not self.sessions:
                return None
            self._next, self.repeats = 0, self.repeats + 1
        session = self.sessions[self._next]
        self._next += 1
        return renamed(session, f"~{self.repeats + 1}") if self.repeats else session


def renamed(session: Session, suffix: str) -> Session:
    """``session`` with ``suffix`` appended to its id and to every subagent's id."""
    turns = tuple(
        dataclasses.replace(turn, subagents=tuple(renamed(child, suffix) for child in turn.subagents))
        if turn.subagents
        else turn
        for turn in session.turns
    )
    return Session(session.session_id + suffix, turns)


def scaled(seconds: float, time_scale: float) -> float:
    """Workload seconds on the run clock: ``seconds / time_scale`` (0 for ``inf``)."""
    return seconds / time_scale if seconds else 0.0


def after_delay(time_scale: float) -> Pace:
    """Closed-loop pacing: a turn starts ``delay_s / time_scale`` after the previous one finished."""
    return lambda turn, session_start, previous_done: previous_done + scaled(turn.delay_s, time_scale)


async def run_session(window: Window, session: Session, pace: Pace) -> bool:
    """Send ``session``'s turns in order (subagents after their turn, before the next one).

    Returns False when the window closed before the session was done."""
    started = previous_done = window.clock.now()
    for index, turn in enumerate(session.turns):
        await window.sleep_until(pace(turn, started, previous_done))
        if not await window.send(session.session_id, index, turn):
            return False
        if turn.subagents:
            done = await asyncio.gather(*(run_session(window, child, pace) for child in turn.subagents))
            if not all(done):
                return False
        previous_done = window.clock.now()
    return True


class Driver(abc.ABC):
    """Runs a workload against a client in one or more windows (levels).

    Args:
        client: sends the requests.
        limits: duration, request count, warm-up and time scale, per window.
        progress: the progress display (None: a silent one).
    """

    def __init__(self, client: Client, limits: Limits, progress: Progress | None = None):
        self.client, self.limits = client, limits
        self.progress = progress or Progress(enabled=False)
        self._window: Window | None = None
        self._stopped = False

    @abc.abstractmethod
    def levels(self) -> list[tuple[int | None, float | None]]:
        """The windows to run, as (concurrency, rate) copied onto their records."""

    @abc.abstractmethod
    async def body(self, window: Window, source: SessionSource) -> None:
        """Start the window's sessions and return once they are all done."""

    def cycles(self) -> bool:
        """Whether sessions repeat when the workload runs out (default: when the run is bounded)."""
        return self.limits.bounded

    def stop(self) -> None:
        """End the run now (Ctrl-C): the current window ends as at its deadline, no more start.
        Safe to call from a signal handler on the run's loop."""
        self._stopped = True
        if self._window is not None:
            self._window.stop()

    async def run(self, workload: Workload) -> RunResult:
        """Run every level in turn; returns what finished (also when stopped early).

        Raises:
            ValueError: a workload with no turns at all.
        """
        if not any(session.turns for session in workload.sessions):
            raise ValueError(f"workload {workload.name!r}: has no requests to send")
        clock, result = Clock(), RunResult()
        source = SessionSource(workload.sessions, self.cycles())
        for concurrency, rate in self.levels():
            if self._stopped:
                break
            window = Window(self.client, clock, self.limits, result.records, self.progress, concurrency, rate)
            self._window = window
            self.progress.start(_label(concurrency, rate), self.limits.max_requests)
            try:
                result.windows.append(await window.run(lambda w: self.body(w, source)))
            finally:
                self.progress.finish()
                self._window = None
        return result


def _label(concurrency: int | None, rate: float | None) -> str:
    if concurrency is not None:
        return f"concurrency {concurrency}"
    if rate is not None:
        return f"rate {rate:g}/s"
    return "schedule"
