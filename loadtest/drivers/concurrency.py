"""Closed-loop load: N live sessions at once (AgentX's definition of concurrency).

Each of N slots takes the next session of the workload, runs its turns in order with their delays
and subagents, then takes the next; a slot whose session is waiting (think time, tool time,
subagents) still holds its place. A sweep runs levels one after another, each a window with its own
warm-up, duration and request limit; records carry their level in ``concurrency``.
"""

import asyncio
from collections.abc import Sequence

from loadtest.clients import Client

from .driver import Driver, SessionSource, after_delay, run_session
from .progress import Progress
from .window import Limits, Window


class ConcurrencyDriver(Driver):
    """Args: ``levels``: live sessions per window (one level, or a sweep such as 1, 2, 4, 8); the
    rest as ``Driver``. A sweep needs a duration or request limit (else its first level would use
    up the workload)."""

    def __init__(
        self, client: Client, limits: Limits, levels: Sequence[int], progress: Progress | None = None
    ):
        super().__init__(client, limits, progress)
        if not levels or any(level < 1 for level in levels):
            raise ValueError(f"--concurrency/--sweep: expected positive session counts, got {list(levels)}")
        if len(levels) > 1 and not limits.bounded:
            raise ValueError("--sweep: give --duration or --max-requests to bound each level")
        self._levels = list(levels)

    def levels(self) -> list[tuple[int | None, float | None]]:
        return [(level, None) for level in self._levels]

    async def body(self, window: Window, source: SessionSource) -> None:
        pace = after_delay(self.limits.time_scale)

        async def slot() -> None:
            while not window.closed:
                session = source.next()
                if session is None or not await run_session(window, session, pace):
                    return

        await asyncio.gather(*(slot() for _ in range(window.concurrency)))
