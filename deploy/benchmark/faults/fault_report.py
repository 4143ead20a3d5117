"""A fault run's figures (the ones issue 11 names), which outcomes were not acceptable, table and JSON.

Acceptable final statuses, by what the client did:

    complete      OK
    cancel_*      OK (finished before the cancel point) or CANCELLED
    deadline      OK or DEADLINE_EXCEEDED
    any kind      UNAVAILABLE or RESOURCE_EXHAUSTED only while a killed worker was down: the request
                  was in flight between the SIGKILL and ``OUTAGE_GRACE_S`` after its restart

Anything else (INTERNAL, UNKNOWN, a stream without a final message, CANCELLED or DEADLINE_EXCEEDED
the client did not cause) is ``unexpected``.
"""

import math
from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np

from .availability_probe import Availability
from .leak_check import LeakCheck
from .scenario import FaultScenario
from .traffic import RequestOutcome
from .worker_kill import KillRecord

OUTAGE_GRACE_S = 2.0  # the router re-probes a worker it marked down after 1 s
_OWN = {"complete": {"OK"}, "cancel_early": {"OK", "CANCELLED"}, "cancel_late": {"OK", "CANCELLED"}}
_OWN["deadline"] = {"OK", "DEADLINE_EXCEEDED"}
_OUTAGE = {"UNAVAILABLE", "RESOURCE_EXHAUSTED"}


def _outages(kills: tuple[KillRecord, ...]) -> list[tuple[float, float]]:
    end = lambda kill: math.inf if kill.restarted_s is None else kill.restarted_s + OUTAGE_GRACE_S  # noqa: E731
    return [(kill.killed_at, kill.killed_at + end(kill)) for kill in kills]


def acceptable(outcome: RequestOutcome, kills: tuple[KillRecord, ...]) -> bool:
    """Whether ``outcome``'s status is one its request may end with (see the module docstring)."""
    if outcome.status in _OWN[outcome.kind]:
        return True
    if outcome.status in _OUTAGE:
        return any(outcome.sent <= end and outcome.ended >= start for start, end in _outages(kills))
    return False


def _ms(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) * 1e3 if values else None


@dataclass(frozen=True)
class FaultReport:
    """One fault run: its set-up, every outcome, the kills, the leak check, the router's availability."""

    model: str
    prefill_workers: int
    decode_workers: int
    scenario: FaultScenario
    outcomes: tuple[RequestOutcome, ...]
    kills: tuple[KillRecord, ...]
    leaks: LeakCheck
    availability: Availability
    router_outcomes: dict[str, int]  # the router's baton_requests_total over the run, by status
    served_after: str  # "OK", or the status of a plain request sent once the run was over
    wall_s: float

    def by_status(self) -> dict[str, int]:
        return dict(sorted(Counter(o.status for o in self.outcomes).items()))

    def by_kind(self) -> dict[str, dict[str, int]]:
        kinds: dict[str, Counter] = {}
        for outcome in self.outcomes:
            kinds.setdefault(outcome.kind, Counter())[outcome.status] += 1
        return {kind: dict(sorted(counts.items())) for kind, counts in sorted(kinds.items())}

    def unexpected(self) -> list[RequestOutcome]:
        """Outcomes whose status their request may not end with."""
        return [outcome for outcome in self.outcomes if not acceptable(outcome, self.kills)]

    def routed_s(self, kill: KillRecord) -> float | None:
        """Seconds from the kill to the end of the first request sent after it that finished OK on
        the restarted worker (decode routes name the worker, prefill routes its address)."""
        ends = [
            o.ended - kill.killed_at
            for o in self.outcomes
            if o.status == "OK"
            and o.sent >= kill.killed_at
            and (
                o.decode_worker == kill.worker if kill.role == "decode" else o.prefill_worker == kill.address
            )
        ]
        return min(ends, default=None)

    def miscounted_unavailable(self) -> int:
        """Requests the router counted ``unavailable`` beyond those its clients saw UNAVAILABLE (with
        one attempt per request, each client status is one router answer)."""
        client = self.by_status().get("UNAVAILABLE", 0)
        return max(0, self.router_outcomes.get("unavailable", 0) - client)

    def summary(self) -> dict:
        """The figures issue 11 names, flat (times in milliseconds)."""
        seconds = [o.seconds for o in self.outcomes]
        return {
            "requests": len(self.outcomes),
            "outcomes_by_status": self.by_status(),
            "unexpected_outcomes": len(self.unexpected()),
            "time_to_final_status_p50_ms": _ms(seconds, 50),
            "time_to_final_status_p99_ms": _ms(seconds, 99),
            "leaked_blocks": self.leaks.total("used_blocks"),
            "leaked_slots": self.leaks.total("used_slots"),
            "leaked_requests": self.leaks.leaked_requests,
            "pools_ok": all(worker.ok for worker in self.leaks.workers),
            "released_within_ms": None if self.leaks.seconds is None else self.leaks.seconds * 1e3,
            "router_availability": self.availability.fraction,
            "router_availability_strict": self.availability.strict_fraction,
            "router_max_latency_ms": self.availability.max_latency_s * 1e3,
            "control_max_latency_ms": self.availability.max_control_s * 1e3,
            "recovery_restart_ms": [
                None if k.restarted_s is None else k.restarted_s * 1e3 for k in self.kills
            ],
            "recovery_routed_ms": [None if (s := self.routed_s(k)) is None else s * 1e3 for k in self.kills],
            "router_miscounted_unavailable": self.miscounted_unavailable(),
            "served_after": self.served_after,
        }

    def as_dict(self) -> dict:
        """Everything, JSON-ready: the summary, the set-up, per-kind outcomes, kills, leaks, probe."""
        return {
            "summary": self.summary(),
            "model": self.model,
            "prefill_workers": self.prefill_workers,
            "decode_workers": self.decode_workers,
            "scenario": asdict(self.scenario),
            "outcomes_by_kind": self.by_kind(),
            "router_outcomes": self.router_outcomes,
            "unexpected": [asdict(o) for o in self.unexpected()],
            "kills": [{**asdict(k), "routed_s": self.routed_s(k)} for k in self.kills],
            "leaks": {
                "bound_s": self.leaks.bound_s,
                "seconds": self.leaks.seconds,
                "workers": [asdict(w) for w in self.leaks.workers],
            },
            "availability": {
                **asdict(self.availability),
                "fraction": self.availability.fraction,
                "strict_fraction": self.availability.strict_fraction,
            },
            "wall_s": self.wall_s,
        }

    def format_table(self) -> str:
        """The summary as aligned lines, then what was still held and the unexpected outcomes."""
        s = self.scenario
        lines = [
            f"fault run: {self.model}, {self.prefill_workers} prefill + {self.decode_workers} decode "
            f"workers; {s.requests} requests at concurrency {s.concurrency}, {s.kills_prefill} prefill + "
            f"{s.kills_decode} decode SIGKILLs, --fail-transfers {s.fail_transfers}, cancel "
            f"{s.cancel_fraction:.0%}, deadline {s.deadline_fraction:.0%} (seed {s.seed}), "
            f"{self.wall_s:.1f} s",
        ]
        for name, value in self.summary().items():
            lines.append(f"  {name:<32} {_show(value)}")
        lines.append(f"  {'outcomes_by_kind':<32} {self.by_kind()}")
        lines.append(f"  {'router_outcomes':<32} {self.router_outcomes}")
        for worker in self.leaks.workers:
            if not worker.clean:
                lines.append(
                    f"  still held on {worker.worker}: blocks {worker.used_blocks}, slots "
                    f"{worker.used_slots}, running {worker.running}, waiting {worker.waiting}, reserved "
                    f"{worker.reserved}, held "
                    f"{worker.held} {list(worker.request_ids[:8])} {worker.error}"
                )
        for outcome in self.unexpected()[:10]:
            lines.append(f"  unexpected: {outcome.request_id} {outcome.status} {outcome.detail[:100]}")
        return "\n".join(lines)


def _show(value) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if value <= 1 else f"{value:.1f}"
    if isinstance(value, list):
        return "[" + ", ".join("-" if v is None else f"{v:.0f}" for v in value) + "]"
    return "-" if value is None else str(value)
