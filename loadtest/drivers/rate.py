"""Open-loop load: sessions start at the arrivals of a Poisson or gamma process, whatever the
server's speed (each arrival starts the next session of the workload; its later turns follow
closed-loop, after their delays). Records carry ``rate``."""

from loadtest.clients import Client

from .arrivals import arrival_gaps
from .driver import Driver, SessionSource, after_delay, run_session
from .progress import Progress
from .window import Limits, Window


class RateDriver(Driver):
    """Args: ``rate`` (sessions per second), ``process`` (``poisson`` or ``gamma``),
    ``burstiness`` (the gamma shape), ``seed``; the rest as ``Driver``. The first session starts at
    once, each next one a drawn gap after the previous arrival."""

    def __init__(
        self,
        client: Client,
        limits: Limits,
        rate: float,
        process: str = "poisson",
        burstiness: float = 1.0,
        seed: int = 0,
        progress: Progress | None = None,
    ):
        super().__init__(client, limits, progress)
        self.rate, self.process, self.burstiness, self.seed = rate, process, burstiness, seed
        next(arrival_gaps(rate, process, burstiness, seed))  # checks the arguments now (generators are lazy)

    def levels(self) -> list[tuple[int | None, float | None]]:
        return [(None, self.rate)]

    async def body(self, window: Window, source: SessionSource) -> None:
        pace = after_delay(self.limits.time_scale)
        gaps = arrival_gaps(self.rate, self.process, self.burstiness, self.seed)
        arrival = window.start_s
        sessions = []
        while True:
            await window.sleep_until(arrival)
            session = None if window.closed else source.next()
            if session is None:
                break
            sessions.append(window.spawn(run_session(window, session, pace)))
            arrival += next(gaps)
        for task in sessions:
            await task
