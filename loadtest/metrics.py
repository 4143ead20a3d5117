"""Load-test metrics from request records: latency distributions, throughputs, goodput, cache hits.

Definitions (formulas, conventions) are in ``docs/loadtest.md``; in short, over the measured
(non-warm-up) records of one window of ``duration_s`` seconds:

- latencies (TTFT, TPOT, ITL, E2E) come from completed requests only (``RequestRecord.ok``);
- ITL follows vLLM ``bench serve`` and Baton's router histogram: one gap per streamed *message*
  after the first, so tokens that arrived together (equal times) give one gap, not zeros;
- a request with one output token has no TPOT (and no interactivity); under an SLO it passes the
  TPOT target, as in vLLM;
- percentiles use numpy's default linear interpolation; an empty sample gives NaN everywhere.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .records import RequestRecord

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
MAX_VALID_ERROR_RATE = 0.10  # a run with more failed requests than this is not a valid measurement
NAN = float("nan")


def finite_or_none(value: float) -> float | None:
    """``value`` for JSON: None where it is NaN or infinite."""
    return float(value) if np.isfinite(value) else None


@dataclass(frozen=True)
class Distribution:
    """Summary of a sample: count, mean, min, max and the percentiles of ``PERCENTILES``.

    Percentiles are ``numpy.percentile(values, q)`` with linear interpolation: for sorted values
    ``v[0..n-1]`` the q-th is ``v[i] + f * (v[i+1] - v[i])`` where ``i + f = q/100 * (n - 1)``.
    Every statistic is NaN when the sample is empty.
    """

    count: int
    mean: float
    min: float
    max: float
    p50: float
    p90: float
    p99: float
    p99_9: float

    @classmethod
    def of(cls, values: Iterable[float]) -> "Distribution":
        sample = np.asarray(list(values), dtype=np.float64)
        if sample.size == 0:
            return cls(0, NAN, NAN, NAN, NAN, NAN, NAN, NAN)
        p50, p90, p99, p99_9 = (float(x) for x in np.percentile(sample, PERCENTILES))
        mean, low, high = float(sample.mean()), float(sample.min()), float(sample.max())
        return cls(int(sample.size), mean, low, high, p50, p90, p99, p99_9)

    def to_dict(self, scale: float = 1.0) -> dict:
        """Every statistic times ``scale`` (1e3 for seconds to milliseconds); NaN becomes None."""
        stats = {
            "p50": self.p50,
            "p90": self.p90,
            "p99": self.p99,
            "p99_9": self.p99_9,
            "mean": self.mean,
            "min": self.min,
            "max": self.max,
        }
        return {"count": self.count} | {key: finite_or_none(value * scale) for key, value in stats.items()}


@dataclass(frozen=True)
class Slo:
    """Per-request latency targets for goodput, in seconds; None leaves that target out.

    A request is good when it completed and every given target holds (value <= target).
    """

    ttft_s: float | None = None
    tpot_s: float | None = None

    def met_by(self, record: RequestRecord) -> bool:
        if not record.ok:
            return False
        if self.ttft_s is not None:
            ttft = record.ttft_s
            if ttft is None or ttft > self.ttft_s:
                return False
        if self.tpot_s is not None:
            tpot = tpot_s(record)
            if tpot is not None and tpot > self.tpot_s:  # one token: no TPOT, so no TPOT miss
                return False
        return True

    def to_dict(self) -> dict:
        return {
            "ttft_ms": None if self.ttft_s is None else self.ttft_s * 1e3,
            "tpot_ms": None if self.tpot_s is None else self.tpot_s * 1e3,
        }


def tpot_s(record: RequestRecord) -> float | None:
    """(E2E - TTFT) / (output tokens - 1); None unless the request completed with two or more tokens."""
    ttft, e2e = record.ttft_s, record.e2e_s
    if not record.ok or ttft is None or e2e is None or record.output_tokens < 2:
        return None
    return (e2e - ttft) / (record.output_tokens - 1)


def itl_s(record: RequestRecord) -> list[float]:
    """Gaps between consecutive streamed messages, a message being a run of equal token times.

    Tokens 1.0, 1.5, 1.5, 1.5, 2.0 (three tokens in the second message) give [0.5, 0.5]: one gap
    per message after the first, as vLLM ``bench serve`` records them. Empty for a failed request.
    """
    if not record.ok:
        return []
    messages = [t for i, t in enumerate(record.token_times_s) if i == 0 or t != record.token_times_s[i - 1]]
    return [later - earlier for earlier, later in zip(messages, messages[1:], strict=False)]


def measured(records: Iterable[RequestRecord]) -> list[RequestRecord]:
    """The records that count: every one not sent during warm-up."""
    return [record for record in records if not record.warmup]


@dataclass(frozen=True)
class LatencySamples:
    """Per-sample latencies of completed requests, in seconds (the inputs of the distributions)."""

    ttft: np.ndarray
    tpot: np.ndarray
    itl: np.ndarray
    e2e: np.ndarray

    @classmethod
    def of(cls, records: Sequence[RequestRecord]) -> "LatencySamples":
        done = [record for record in records if record.ok]
        tpots = [tpot_s(record) for record in done]
        return cls(
            ttft=np.array([r.ttft_s for r in done if r.ttft_s is not None], dtype=np.float64),
            tpot=np.array([t for t in tpots if t is not None], dtype=np.float64),
            itl=np.array([gap for record in done for gap in itl_s(record)], dtype=np.float64),
            e2e=np.array([r.e2e_s for r in done], dtype=np.float64),
        )


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else NAN


@dataclass(frozen=True)
class LoadMetrics:
    """Metrics of one measurement window (all levels pooled, or one level of a sweep).

    Latency distributions are in seconds, ``interactivity`` in tokens/s per user (1 / TPOT);
    rates are per second of ``duration_s``. ``cache_hit_rate_by_session`` maps each session to
    Σcached / Σinput tokens over its completed requests.
    """

    duration_s: float
    completed: int
    failed: int
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2e: Distribution
    interactivity: Distribution
    output_tokens_per_s: float
    total_tokens_per_s: float
    requests_per_s: float
    goodput_rps: float
    token_goodput_per_s: float
    error_rate: float
    valid: bool
    cached_token_ratio: float
    session_cache_hit_rate: Distribution
    cache_hit_rate_by_session: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The JSON metric block of ``summary.json`` (latencies in ms; NaN becomes None)."""
        return {
            "duration_s": finite_or_none(self.duration_s),
            "requests": {"completed": self.completed, "failed": self.failed},
            "tokens": {
                "input": self.input_tokens,
                "output": self.output_tokens,
                "cached": self.cached_tokens,
            },
            "ttft_ms": self.ttft.to_dict(1e3),
            "tpot_ms": self.tpot.to_dict(1e3),
            "itl_ms": self.itl.to_dict(1e3),
            "e2e_ms": self.e2e.to_dict(1e3),
            "interactivity_tokens_per_s": self.interactivity.to_dict(),
            "output_tokens_per_s": finite_or_none(self.output_tokens_per_s),
            "total_tokens_per_s": finite_or_none(self.total_tokens_per_s),
            "requests_per_s": finite_or_none(self.requests_per_s),
            "goodput_rps": finite_or_none(self.goodput_rps),
            "token_goodput_per_s": finite_or_none(self.token_goodput_per_s),
            "error_rate": finite_or_none(self.error_rate),
            "valid": self.valid,
            "cached_token_ratio": finite_or_none(self.cached_token_ratio),
            "session_cache_hit_rate": self.session_cache_hit_rate.to_dict(),
            "cache_hit_rate_by_session": {
                session: finite_or_none(rate) for session, rate in self.cache_hit_rate_by_session.items()
            },
        }


def compute_metrics(records: Iterable[RequestRecord], duration_s: float, slo: Slo = Slo()) -> LoadMetrics:
    """Metrics of the measured records (warm-up ones are dropped here) over ``duration_s`` seconds.

    Args:
        records: the window's records; those with ``warmup`` set are ignored.
        duration_s: the measured wall-clock window; rates are NaN unless it is positive.
        slo: the goodput targets.
    """
    kept = measured(records)
    done = [record for record in kept if record.ok]
    good = [record for record in done if slo.met_by(record)]
    samples = LatencySamples.of(done)
    input_tokens = sum(record.input_tokens for record in done)
    output_tokens = sum(record.output_tokens for record in done)
    cached_tokens = sum(record.cached_tokens for record in done)
    by_session: dict[str, list[int]] = {}
    for record in done:
        sums = by_session.setdefault(record.session_id, [0, 0])
        sums[0] += record.cached_tokens
        sums[1] += record.input_tokens
    hit_rates = {session: _ratio(cached, total) for session, (cached, total) in by_session.items()}
    error_rate = _ratio(len(kept) - len(done), len(kept))
    return LoadMetrics(
        duration_s=duration_s,
        completed=len(done),
        failed=len(kept) - len(done),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cached_tokens=cached_tokens,
        ttft=Distribution.of(samples.ttft),
        tpot=Distribution.of(samples.tpot),
        itl=Distribution.of(samples.itl),
        e2e=Distribution.of(samples.e2e),
        interactivity=Distribution.of(1.0 / samples.tpot[samples.tpot > 0]),
        output_tokens_per_s=_ratio(output_tokens, duration_s),
        total_tokens_per_s=_ratio(input_tokens + output_tokens, duration_s),
        requests_per_s=_ratio(len(done), duration_s),
        goodput_rps=_ratio(len(good), duration_s),
        token_goodput_per_s=_ratio(sum(record.output_tokens for record in good), duration_s),
        error_rate=error_rate,
        valid=bool(error_rate <= MAX_VALID_ERROR_RATE),  # NaN (no requests) is not valid
        cached_token_ratio=_ratio(cached_tokens, input_tokens),
        session_cache_hit_rate=Distribution.of(rate for rate in hit_rates.values() if np.isfinite(rate)),
        cache_hit_rate_by_session=hit_rates,
    )


class Level(NamedTuple):
    """One step of a sweep: the live-session count or the request rate (None where not swept)."""

    concurrency: int | None
    rate: float | None

    @property
    def label(self) -> str:
        parts = []
        if self.concurrency is not None:
            parts.append(f"concurrency {self.concurrency}")
        if self.rate is not None:
            parts.append(f"rate {self.rate:g}/s")
        return ", ".join(parts) or "all"


def level_of(record: RequestRecord) -> Level:
    return Level(record.concurrency, record.rate)


def split_levels(records: Iterable[RequestRecord]) -> dict[Level, list[RequestRecord]]:
    """Measured records by level, in increasing order of (concurrency, rate) (None first)."""
    groups: dict[Level, list[RequestRecord]] = {}
    for record in measured(records):
        groups.setdefault(level_of(record), []).append(record)

    def order(level: Level) -> tuple:
        return (
            level.concurrency is not None,
            level.concurrency or 0,
            level.rate is not None,
            level.rate or 0,
        )

    return {level: groups[level] for level in sorted(groups, key=order)}


def span_s(records: Sequence[RequestRecord]) -> float:
    """First start to last end (or last token) of ``records``: a level's window when none is given."""
    if not records:
        return NAN
    ends = [
        r.end_s if r.end_s is not None else (r.token_times_s[-1] if r.token_times_s else r.start_s)
        for r in records
    ]
    return max(ends) - min(record.start_s for record in records)
