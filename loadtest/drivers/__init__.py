"""Load-test drivers: when each session starts and each turn is sent.

- ``ConcurrencyDriver``: N live sessions at once (closed loop); a list of levels is a sweep.
- ``RateDriver``: sessions arrive open-loop at a Poisson or gamma rate.
- ``ScheduleDriver``: turns replayed at their trace timestamps.

All run in windows bounded by ``Limits`` (duration, request count, warm-up) and return a
``RunResult``; ``driver.stop()`` ends a run early, keeping what finished. See ``window.py`` for how
a window ends and what happens to requests in flight at a deadline.
"""

from .arrivals import PROCESSES, arrival_gaps
from .concurrency import ConcurrencyDriver
from .driver import Driver, RunResult, SessionSource
from .progress import Progress
from .rate import RateDriver
from .schedule import ScheduleDriver
from .window import Limits, WindowStats

__all__ = [
    "PROCESSES",
    "ConcurrencyDriver",
    "Driver",
    "Limits",
    "Progress",
    "RateDriver",
    "RunResult",
    "ScheduleDriver",
    "SessionSource",
    "WindowStats",
    "arrival_gaps",
]
