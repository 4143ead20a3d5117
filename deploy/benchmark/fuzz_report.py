"""What a fuzz run found: cases by surface, answers by status, findings, rejection latency."""

from collections import Counter
from dataclasses import dataclass, field

from .fuzz_cases import FuzzCase
from .fuzz_client import Outcome

_EXAMPLES = 10  # findings kept with their payload, for reproducing them


@dataclass
class FuzzReport:
    """Filled by ``add`` as cases run; ``serving`` holds the failures of the normal requests sent
    afterwards and ``worker_restarts`` the worker processes that died meanwhile. ``passed`` is the
    verdict: no finding, no restart, still serving."""

    seed: int
    cases: int = 0
    surfaces: Counter = field(default_factory=Counter)  # "http /v1/completions fields" -> cases
    statuses: Counter = field(default_factory=Counter)  # "http 400" -> cases
    findings: Counter = field(default_factory=Counter)  # "5xx", "INTERNAL", "hang", ... -> cases
    examples: list[dict] = field(default_factory=list)
    rejection_seconds: list[float] = field(default_factory=list)
    seconds: float = 0.0
    serving: list[str] | None = None
    worker_restarts: int = 0

    def add(self, case: FuzzCase, outcome: Outcome) -> None:
        self.cases += 1
        self.surfaces[f"{case.surface} {case.method} {case.kind}"] += 1
        self.statuses[outcome.status] += 1
        if outcome.refused:
            self.rejection_seconds.append(outcome.seconds)
        if outcome.finding is not None:
            self.findings[outcome.finding] += 1
            if len(self.examples) < _EXAMPLES:
                self.examples.append(
                    {
                        "finding": outcome.finding,
                        "method": case.method,
                        "kind": case.kind,
                        "status": outcome.status,
                        "detail": outcome.detail,
                        "content_type": case.content_type,
                        "payload": case.payload[:200].decode(errors="backslashreplace"),
                    }
                )

    @property
    def passed(self) -> bool:
        return not self.findings and not self.worker_restarts and self.serving == []

    def rejection_percentile(self, q: float) -> float | None:
        """Seconds below which a fraction ``q`` of the refusals were answered (nearest rank)."""
        if not self.rejection_seconds:
            return None
        ordered = sorted(self.rejection_seconds)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def as_dict(self) -> dict:
        return {
            "seed": self.seed,
            "cases": self.cases,
            "seconds": round(self.seconds, 3),
            "surfaces": dict(sorted(self.surfaces.items())),
            "statuses": dict(sorted(self.statuses.items())),
            "findings": dict(self.findings),
            "examples": self.examples,
            "rejections": len(self.rejection_seconds),
            "rejection_p50_s": self.rejection_percentile(0.5),
            "rejection_p99_s": self.rejection_percentile(0.99),
            "worker_restarts": self.worker_restarts,
            "serving_after": self.serving,
            "passed": self.passed,
        }

    def format(self) -> str:
        """The report as text; the last line says whether the cluster still serves."""
        lines = [f"fuzz: {self.cases} cases, seed {self.seed}, {self.seconds:.1f} s", "cases by surface:"]
        lines += [f"  {name:<44} {count:>7}" for name, count in sorted(self.surfaces.items())]
        lines.append("answers:")
        lines += [f"  {name:<44} {count:>7}" for name, count in sorted(self.statuses.items())]
        names = ("crash", "5xx", "INTERNAL", "UNKNOWN", "UNAVAILABLE", "hang", "unnamed", "stream-error")
        lines.append("findings: " + ", ".join(f"{name} {self.findings[name]}" for name in names))
        lines.append(f"worker restarts: {self.worker_restarts}")
        for example in self.examples:
            lines.append(f"  {example}")
        p50, p99 = self.rejection_percentile(0.5), self.rejection_percentile(0.99)
        if p50 is not None:
            lines.append(
                f"rejections: {len(self.rejection_seconds)}, latency p50 {p50 * 1e3:.1f} ms, "
                f"p99 {p99 * 1e3:.1f} ms"
            )
        if self.serving is None:
            lines.append("serving after: not checked")
        elif self.serving:
            lines.append("serving after: FAILED: " + "; ".join(self.serving))
        else:
            lines.append("serving after: OK (a normal request on every surface answered in full)")
        return "\n".join(lines)
