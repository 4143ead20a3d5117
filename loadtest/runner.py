"""One load test from start to finish: open the client, drive the workload, read the server's
counters around it, and hand everything to the report.

    plan = RunPlan(target=parse_target(url, explicit=True), mode="concurrency", levels=(4,))
    outcome = run_plan(plan, workload)          # blocking; Ctrl-C ends the run, keeps what finished
    summary = write_report(out, outcome.result.records, outcome.result.measured_s, ...)
"""

import asyncio
import signal
from dataclasses import asdict, dataclass, field

from loadtest.clients import Client, Target, open_client
from loadtest.drivers import (
    ConcurrencyDriver,
    Driver,
    Limits,
    Progress,
    RateDriver,
    RunResult,
    ScheduleDriver,
)
from loadtest.metrics import Level
from loadtest.scrape import counter_deltas, try_scrape
from loadtest.workload import Workload
from sdk.tls import ClientTls

MODES = ("concurrency", "rate", "schedule")


@dataclass(frozen=True)
class RunPlan:
    """How to run: where, which driver, its limits (validated at construction, errors name flags).

    Attributes:
        target: from ``parse_target``.
        mode: ``concurrency`` (``levels``: one or a sweep), ``rate`` or ``schedule``.
        levels: live sessions per window (concurrency mode).
        rate, arrival, burstiness, seed: the arrival process (rate mode).
        limits: duration, request count, warm-up, time scale (per window).
        metrics_url: a Prometheus endpoint read before and after, or None.
        model: the HTTP ``model`` field (None: left out).
        request_timeout_s: limit on each request.
        progress: draw a progress line on stderr.
    """

    target: Target
    mode: str = "concurrency"
    levels: tuple[int, ...] = (1,)
    rate: float | None = None
    arrival: str = "poisson"
    burstiness: float = 1.0
    seed: int = 0
    limits: Limits = field(default_factory=Limits)
    metrics_url: str | None = None
    model: str | None = None
    request_timeout_s: float = 600.0
    progress: bool = True

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {self.mode!r}")
        if self.mode == "rate" and self.rate is None:
            raise ValueError("--rate: required in rate mode")
        if not self.request_timeout_s > 0:
            raise ValueError(f"--request-timeout: must be positive, got {self.request_timeout_s}")

    def driver(self, client: Client) -> Driver:
        """The driver this plan describes, sending through ``client``."""
        progress = Progress(enabled=self.progress)
        if self.mode == "concurrency":
            return ConcurrencyDriver(client, self.limits, self.levels, progress)
        if self.mode == "rate":
            return RateDriver(
                client, self.limits, self.rate, self.arrival, self.burstiness, self.seed, progress
            )
        return ScheduleDriver(client, self.limits, progress)

    def to_dict(self) -> dict:
        """The plan as the report's ``config`` shows it."""
        found = asdict(self)
        found["target"] = self.target.url
        if self.mode != "concurrency":
            found.pop("levels")
        if self.mode != "rate":
            for name in ("rate", "arrival", "burstiness"):
                found.pop(name)
        return found


@dataclass(frozen=True)
class Outcome:
    """A finished run: what the driver measured and the server's counter deltas (``{}`` without
    ``metrics_url``; ``{"error": ...}`` when the endpoint could not be read afterwards)."""

    result: RunResult
    server: dict

    def level_durations_s(self) -> dict[Level, float]:
        """Each window's measured seconds, keyed as the report groups records."""
        return {Level(w.concurrency, w.rate): w.measured_s for w in self.result.windows}

    def facts(self) -> dict:
        """Run facts for the report's ``config``: windows, cancellations, interruption."""
        windows = [asdict(w) | {"measured_s": w.measured_s} for w in self.result.windows]
        return {
            "windows": windows,
            "cancelled_at_end": self.result.cancelled,
            "interrupted": self.result.interrupted,
        }


def run_plan(
    plan: RunPlan, workload: Workload, token: str | None = None, tls: ClientTls | None = None
) -> Outcome:
    """Run ``workload`` as ``plan`` says (blocking). Ctrl-C during the run ends it like a deadline
    and the outcome keeps what finished; a second Ctrl-C raises ``KeyboardInterrupt``. ``token``:
    the bearer token every request carries (kept out of the plan, hence out of the report); ``tls``:
    the clients' TLS to the target (None: plaintext).

    Raises:
        ValueError: ``--metrics-url`` could not be read before the run (nothing was sent).
    """
    before, error = try_scrape(plan.metrics_url)
    if error is not None:
        raise ValueError(f"--metrics-url: cannot read {error}")
    result = asyncio.run(_drive(plan, workload, token, tls))
    server: dict = {}
    if before is not None:
        after, error = try_scrape(plan.metrics_url)
        server = {"error": error} if after is None else counter_deltas(before, after)
    return Outcome(result, server)


async def _drive(plan: RunPlan, workload: Workload, token: str | None, tls: ClientTls | None) -> RunResult:
    client = open_client(
        plan.target, model=plan.model, timeout_s=plan.request_timeout_s, token=token, tls=tls
    )
    async with client:
        driver = plan.driver(client)
        loop = asyncio.get_running_loop()

        def interrupt() -> None:
            loop.remove_signal_handler(signal.SIGINT)  # the next Ctrl-C is a KeyboardInterrupt
            driver.stop()

        try:
            loop.add_signal_handler(signal.SIGINT, interrupt)
            installed = True
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals
            installed = False
        try:
            return await driver.run(workload)
        finally:
            if installed:
                loop.remove_signal_handler(signal.SIGINT)
