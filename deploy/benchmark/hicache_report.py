"""What ``baton bench hicache`` reports: per trace and cluster mode, one arm with the host tier and one
without, side by side, and the ratios the issue sets goals for (later-turn TTFT >= 5x lower, prefill
tokens computed >= 3x fewer with the tier)."""

import math
from dataclasses import asdict, dataclass

import numpy as np

from loadtest.metrics import Distribution, Slo, compute_metrics
from loadtest.records import RequestRecord

TTFT_GOAL = 5.0  # later-turn TTFT p50, without / with the tier
COMPUTED_GOAL = 3.0  # prefill tokens computed, without / with the tier


@dataclass(frozen=True)
class ArmResult:
    """One replay on one cluster.

    Attributes:
        tier: whether the cluster had a node tier (``baton cache``).
        requests, failed: requests sent, and of those failed.
        first_error: the first failed request's error (``CODE: details``), "" when none failed.
        later_requests: later turns among them (``hicache_workload``).
        later_ttft_p50_ms, later_ttft_p99_ms: TTFT of the completed later turns.
        prompt_tokens: prompt tokens of the completed requests.
        computed_tokens: prompt tokens the workers computed, from the router's counters
            (``baton_prompt_tokens_total - baton_cached_prompt_tokens_total``), or from the requests'
            usage when the counters could not be read (``computed_from``).
        cached_tokens, cached_tokens_host: prompt tokens served from a prefix cache, and of those loaded
            from a host tier (usage of each completed request).
        later_cached_tokens_host: ``cached_tokens_host`` of the later turns.
        goodput_rps: completed requests per second that met the SLO.
        wall_s: the replay's measured seconds.
    """

    tier: bool
    requests: int
    failed: int
    first_error: str
    later_requests: int
    later_ttft_p50_ms: float
    later_ttft_p99_ms: float
    prompt_tokens: int
    computed_tokens: int
    computed_from: str
    cached_tokens: int
    cached_tokens_host: int
    later_cached_tokens_host: int
    goodput_rps: float
    wall_s: float


def arm_result(
    tier: bool,
    records: list[RequestRecord],
    later: tuple[bool, ...],
    server: dict,
    wall_s: float,
    slo: Slo,
) -> ArmResult:
    """Summarise one replay: ``records`` (any order; one per request, sent one-turn sessions in
    ``later``'s order, so their start times give that order) and the router's counter deltas."""
    ordered = sorted(records, key=lambda record: record.start_s)
    done = [(record, is_later) for record, is_later in zip(ordered, later, strict=False) if record.ok]
    later_ttft = Distribution.of(r.ttft_s for r, is_later in done if is_later and r.ttft_s is not None)
    prompt = sum(r.input_tokens for r, _ in done)
    cached = sum(r.cached_tokens for r, _ in done)
    counted = {
        name: server.get(name) for name in ("baton_prompt_tokens_total", "baton_cached_prompt_tokens_total")
    }
    if all(isinstance(value, float) for value in counted.values()):
        computed = int(counted["baton_prompt_tokens_total"] - counted["baton_cached_prompt_tokens_total"])
        source = "router counters"
    else:
        computed, source = prompt - cached, "request usage"
    return ArmResult(
        tier=tier,
        requests=len(records),
        failed=len(records) - len(done),
        first_error=next((r.error or "did not end" for r in ordered if not r.ok), ""),
        later_requests=sum(1 for _, is_later in done if is_later),
        later_ttft_p50_ms=later_ttft.p50 * 1e3,
        later_ttft_p99_ms=later_ttft.p99 * 1e3,
        prompt_tokens=prompt,
        computed_tokens=computed,
        computed_from=source,
        cached_tokens=cached,
        cached_tokens_host=sum(r.cached_tokens_host for r, _ in done),
        later_cached_tokens_host=sum(r.cached_tokens_host for r, is_later in done if is_later),
        goodput_rps=compute_metrics(records, wall_s, slo).goodput_rps,
        wall_s=wall_s,
    )


@dataclass(frozen=True)
class Comparison:
    """One trace on one cluster mode: the arm without the tier and the arm with it.

    Attributes:
        trace: the trace's name; mode: ``disaggregated`` or ``colocated``.
        working_set_blocks, pool_blocks: the replay's working set and the device pool (``--kv-blocks``)
            of every worker, in blocks; tier_gib: the node tier's size in the tier arm.
    """

    trace: str
    mode: str
    working_set_blocks: int
    pool_blocks: int
    tier_gib: float
    without: ArmResult
    with_tier: ArmResult

    @property
    def ttft_ratio(self) -> float:
        """Later-turn TTFT p50 without the tier over with it (the goal: >= 5)."""
        return _ratio(self.without.later_ttft_p50_ms, self.with_tier.later_ttft_p50_ms)

    @property
    def ttft_p99_ratio(self) -> float:
        return _ratio(self.without.later_ttft_p99_ms, self.with_tier.later_ttft_p99_ms)

    @property
    def computed_ratio(self) -> float:
        """Prefill tokens computed without the tier over with it (the goal: >= 3)."""
        return _ratio(self.without.computed_tokens, self.with_tier.computed_tokens)

    @property
    def goodput_ratio(self) -> float:
        return _ratio(self.with_tier.goodput_rps, self.without.goodput_rps)

    def as_dict(self) -> dict:
        ratios = {
            "later_ttft_p50": self.ttft_ratio,
            "later_ttft_p99": self.ttft_p99_ratio,
            "computed_tokens": self.computed_ratio,
            "goodput": self.goodput_ratio,
        }
        found = asdict(self)
        found["ratios"] = {name: _finite(value) for name, value in ratios.items()}
        found["goals_met"] = {
            "later_ttft_5x": bool(self.ttft_ratio >= TTFT_GOAL),
            "computed_tokens_3x": bool(self.computed_ratio >= COMPUTED_GOAL),
        }
        return _json_safe(found)


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else math.nan


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def _json_safe(value):
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, float):
        return _finite(value)
    return value


_ROWS = (
    ("requests (later turns)", lambda a: f"{a.requests} ({a.later_requests})"),
    ("failed", lambda a: f"{a.failed}"),
    ("later-turn TTFT p50 ms", lambda a: f"{a.later_ttft_p50_ms:.1f}"),
    ("later-turn TTFT p99 ms", lambda a: f"{a.later_ttft_p99_ms:.1f}"),
    ("prompt tokens", lambda a: f"{a.prompt_tokens:,}"),
    ("prefill tokens computed", lambda a: f"{a.computed_tokens:,}"),
    ("cached tokens (host)", lambda a: f"{a.cached_tokens:,} ({a.cached_tokens_host:,})"),
    ("later turns: cached host", lambda a: f"{a.later_cached_tokens_host:,}"),
    ("goodput req/s", lambda a: f"{a.goodput_rps:.3f}"),
    ("wall s", lambda a: f"{a.wall_s:.1f}"),
)


def format_comparison(comparison: Comparison) -> str:
    """The two arms side by side and the ratios, as a fixed-width table."""
    c = comparison
    lines = [
        f"{c.trace}, {c.mode}: working set {c.working_set_blocks} blocks, device pool {c.pool_blocks} "
        f"blocks ({c.pool_blocks / max(c.working_set_blocks, 1):.0%}), tier {c.tier_gib:.3g} GiB",
        f"  {'':<26}{'no tier':>16}{'tier':>16}{'ratio':>10}",
    ]
    ratios = {
        "later-turn TTFT p50 ms": (c.ttft_ratio, TTFT_GOAL),
        "later-turn TTFT p99 ms": (c.ttft_p99_ratio, None),
        "prefill tokens computed": (c.computed_ratio, COMPUTED_GOAL),
        "goodput req/s": (c.goodput_ratio, None),
    }
    for name, cell in _ROWS:
        ratio, goal = ratios.get(name, (None, None))
        shown = "" if ratio is None else f"{ratio:.2f}x"
        if goal is not None and np.isfinite(ratio):
            shown += " ok" if ratio >= goal else f" <{goal:g}x"
        lines.append(f"  {name:<26}{cell(c.without):>16}{cell(c.with_tier):>16}{shown:>10}")
    for arm in (c.without, c.with_tier):
        if arm.first_error:
            lines.append(f"  first failure ({'tier' if arm.tier else 'no tier'}): {arm.first_error[:300]}")
    source = c.with_tier.computed_from
    lines.append(
        f"  (prefill tokens computed: from the {source}; ratios are no tier / tier, goodput tier / no tier)"
    )
    return "\n".join(lines)
