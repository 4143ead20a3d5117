"""Fixed-schedule replay: each turn is sent at its trace timestamp ``Turn.at_s`` (divided by the
time scale), or later if its session is still busy: at ``max(at_s, previous turn done + delay_s)``
— the agent cannot think about an answer before it has arrived.

Every session of the workload is replayed once; a turn without a timestamp follows its previous
turn by ``delay_s``. Subagent sessions' timestamps are read on the same clock (from the run's
start). Records carry neither ``concurrency`` nor ``rate``.
"""

import asyncio

from loadtest.workload import Turn

from .driver import Driver, SessionSource, run_session, scaled
from .window import Window


class ScheduleDriver(Driver):
    """Args as ``Driver``; ``limits.time_scale`` compresses (> 1) or stretches (< 1) the schedule."""

    def levels(self) -> list[tuple[int | None, float | None]]:
        return [(None, None)]

    def cycles(self) -> bool:
        return False  # a replay is the trace, once

    async def body(self, window: Window, source: SessionSource) -> None:
        time_scale, origin = self.limits.time_scale, window.start_s

        def pace(turn: Turn, session_start: float, previous_done: float) -> float:
            after = previous_done + scaled(turn.delay_s, time_scale)
            return after if turn.at_s is None else max(origin + scaled(turn.at_s, time_scale), after)

        sessions = []
        while (session := source.next()) is not None:
            sessions.append(run_session(window, session, pace))
        await asyncio.gather(*sessions)
