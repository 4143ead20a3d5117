"""A HiCache fault run's findings (``tier_faults.py``): every turn, the tier's kill and restart, the Redis
outage, the leak check, the log lines each fault left; as a summary, a table and JSON."""

from collections import Counter
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from .leak_check import LeakCheck
from .sessions import TurnOutcome

if TYPE_CHECKING:  # tier_faults imports this module
    from .tier_faults import TierFaultScenario


@dataclass(frozen=True)
class TierKill:
    """The tier's SIGKILL (``killed_at``: ``time.monotonic()``). Seconds are from the kill; None: not
    within the run's bound. ``restarted_s``: the supervisor's restart answered health SERVING on the same
    port; ``tier_hit_s``: a turn sent after that loaded part of its prefix from the new run (the workers
    attached again and moved pages over NIXL); ``restarts``: the tier's restart count at the end;
    ``workers_reattached``: the workers that logged attaching to the new run."""

    workers_reattached: tuple[str, ...]
    killed_at: float
    restarted_s: float | None
    restarted_at: float | None
    tier_hit_s: float | None
    restarts: int


@dataclass(frozen=True)
class RedisOutage:
    """Redis SIGKILLed at ``killed_at``, started again on its port at ``restarted_at``.
    ``reported_down_s`` / ``reported_up_s``: from each, until the router's and the tier's
    ``baton_hicache_redis_up`` both read 0 / 1 (None: not within the bound); ``index_republished``: the
    tier wrote its blocks into the restarted (empty) Redis again."""

    killed_at: float
    reported_down_s: float | None
    restarted_at: float
    reported_up_s: float | None
    index_republished: bool


@dataclass(frozen=True)
class TierFaultReport:
    """One run: its set-up, every turn, both faults, what the workers still held, the fault log lines."""

    model: str
    scenario: "TierFaultScenario"
    outcomes: tuple[TurnOutcome, ...]
    tier_kill: TierKill
    redis_outage: RedisOutage
    leaks: LeakCheck
    worker_lines: tuple[str, ...]  # the workers' lines logged during the run ("[decode-0] ...")
    tier_lines: tuple[str, ...]  # the tier's ("[cache] ...")
    router_lines: tuple[str, ...]  # the router's Redis link ("redis ... unavailable ...")
    wall_s: float

    def failed(self) -> list[TurnOutcome]:
        """Turns that did not complete: none may (the tier and Redis are caches)."""
        return [outcome for outcome in self.outcomes if outcome.status != "OK"]

    def turns_between(self, start: float | None, end: float | None) -> list[TurnOutcome]:
        """Turns in flight at some point between ``start`` and ``end`` (monotonic seconds)."""
        if start is None or end is None:
            return []
        return [o for o in self.outcomes if o.sent <= end and o.ended >= start]

    def tier_outage_turns(self) -> list[TurnOutcome]:
        """Turns in flight while the tier was down (from its kill to its restart serving)."""
        kill = self.tier_kill
        return self.turns_between(kill.killed_at, kill.restarted_at)

    def redis_outage_turns(self) -> list[TurnOutcome]:
        """Turns in flight while Redis was down."""
        return self.turns_between(self.redis_outage.killed_at, self.redis_outage.restarted_at)

    def summary(self) -> dict:
        """The figures, flat (seconds as they are)."""
        kill, outage = self.tier_kill, self.redis_outage
        return {
            "turns": len(self.outcomes),
            "turns_by_status": dict(sorted(Counter(o.status for o in self.outcomes).items())),
            "failed_turns": len(self.failed()),
            "turns_loading_from_tier": sum(o.cached_tokens_host > 0 for o in self.outcomes),
            "tier_restarted_s": kill.restarted_s,
            "tier_hit_after_restart_s": kill.tier_hit_s,
            "workers_reattached": list(kill.workers_reattached),
            "turns_during_tier_outage": len(self.tier_outage_turns()),
            "redis_reported_down_s": outage.reported_down_s,
            "redis_reported_up_s": outage.reported_up_s,
            "turns_during_redis_outage": len(self.redis_outage_turns()),
            "index_republished": outage.index_republished,
            "pools_clean": self.leaks.clean,
            "wall_s": self.wall_s,
        }

    def as_dict(self) -> dict:
        """Everything, JSON-ready."""
        return {
            "summary": self.summary(),
            "model": self.model,
            "scenario": asdict(self.scenario),
            "failed": [asdict(o) for o in self.failed()],
            "tier_kill": asdict(self.tier_kill),
            "redis_outage": asdict(self.redis_outage),
            "leaks": {"seconds": self.leaks.seconds, "workers": [asdict(w) for w in self.leaks.workers]},
            "log_lines": {
                "workers": list(self.worker_lines),
                "tier": list(self.tier_lines),
                "router": list(self.router_lines),
            },
        }

    def format_table(self) -> str:
        """The summary as aligned lines, then what was still held and the failed turns."""
        plan = self.scenario.sessions
        lines = [
            f"HiCache fault run: {self.model}, {plan.sessions} sessions, tier SIGKILL then Redis SIGKILL, "
            f"{self.wall_s:.1f} s"
        ]
        for name, value in self.summary().items():
            shown = f"{value:.2f}" if isinstance(value, float) else ("-" if value is None else str(value))
            lines.append(f"  {name:<28} {shown}")
        for worker in self.leaks.workers:
            if not worker.clean:
                lines.append(f"  still held on {worker.worker}: {worker}")
        for o in self.failed()[:10]:
            lines.append(f"  failed: session {o.session} turn {o.turn} {o.status} {o.detail[:100]}")
        return "\n".join(lines)
