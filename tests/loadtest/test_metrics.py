"""Load-test metrics on hand-built timelines whose answers are worked out by hand."""

import math

import pytest

from loadtest.metrics import (
    Distribution,
    Level,
    LoadMetrics,
    Slo,
    compute_metrics,
    itl_s,
    span_s,
    split_levels,
    tpot_s,
)
from loadtest.records import RequestRecord


def done(
    times, start=0.0, end=None, session="s", turn=0, input_tokens=100, cached=0, **extra
) -> RequestRecord:
    """A completed request whose tokens arrived at ``times`` (one token per entry)."""
    return RequestRecord(
        session_id=session,
        turn=turn,
        start_s=start,
        input_tokens=input_tokens,
        token_times_s=list(times),
        end_s=times[-1] if end is None else end,
        output_tokens=len(times),
        cached_tokens=cached,
        **extra,
    )


def failed(start=0.0, end=1.0, times=(), **extra) -> RequestRecord:
    return RequestRecord("f", 0, start, 100, list(times), end, len(times), error="UNAVAILABLE: gone", **extra)


def test_one_request_timeline():
    record = done([1.0, 1.5, 2.0])
    assert record.ttft_s == 1.0 and record.e2e_s == 2.0
    assert tpot_s(record) == pytest.approx(0.5)
    assert itl_s(record) == pytest.approx([0.5, 0.5])
    metrics = compute_metrics([record], duration_s=4.0)
    assert (metrics.ttft.p50, metrics.tpot.p50, metrics.e2e.p50) == pytest.approx((1.0, 0.5, 2.0))
    assert metrics.itl.count == 2 and metrics.itl.mean == pytest.approx(0.5)
    assert metrics.interactivity.p50 == pytest.approx(2.0)  # 1 / TPOT
    assert metrics.output_tokens_per_s == pytest.approx(3 / 4)
    assert metrics.total_tokens_per_s == pytest.approx(103 / 4)
    assert metrics.requests_per_s == pytest.approx(1 / 4)


def test_batched_tokens_give_one_gap_per_message():
    # Messages at 1.0 (1 token), 1.5 (3 tokens), 2.0 (1 token): two gaps, no zeros (vLLM bench serve).
    record = done([1.0, 1.5, 1.5, 1.5, 2.0])
    assert itl_s(record) == pytest.approx([0.5, 0.5])
    assert tpot_s(record) == pytest.approx((2.0 - 1.0) / 4)  # TPOT counts tokens, not messages
    # Two tokens in the first message: TTFT is still the first message's time.
    record = done([1.0, 1.0, 3.0])
    assert record.ttft_s == 1.0 and itl_s(record) == pytest.approx([2.0])


def test_tpot_uses_the_stream_end():
    record = done([1.0, 1.5, 2.0], end=2.4)  # the stream closed 0.4 s after the last token
    assert tpot_s(record) == pytest.approx((2.4 - 1.0) / 2)
    assert compute_metrics([record], 1.0).e2e.p50 == pytest.approx(2.4)


def test_failed_request_counts_in_error_rate_only():
    metrics = compute_metrics([done([1.0, 2.0]), failed(times=[0.1, 0.2, 0.3])], duration_s=2.0)
    assert (metrics.completed, metrics.failed) == (1, 1)
    assert metrics.error_rate == 0.5 and not metrics.valid
    assert metrics.ttft.count == 1 and metrics.ttft.p50 == 1.0  # the failure's 0.1 s TTFT is not there
    assert metrics.itl.count == 1 and metrics.e2e.count == 1
    assert metrics.output_tokens == 2 and metrics.input_tokens == 100  # completed requests only


def test_unfinished_request_is_failed():
    record = RequestRecord("s", 0, 0.0, 10, [1.0], end_s=None, output_tokens=1)
    metrics = compute_metrics([record, done([1.0, 2.0])], 1.0)
    assert (metrics.completed, metrics.failed) == (1, 1)


def test_one_token_request_has_no_tpot():
    one = done([0.3])
    assert tpot_s(one) is None and itl_s(one) == []
    metrics = compute_metrics([one, done([1.0, 1.5, 2.0])], 1.0)
    assert metrics.ttft.count == 2 and metrics.tpot.count == 1 and metrics.interactivity.count == 1
    assert metrics.tpot.p50 == pytest.approx(0.5)


@pytest.mark.parametrize(
    "error_count, valid",
    [(0, True), (1, True), (2, False)],
    ids=["no-errors", "exactly-10pct", "20pct"],
)
def test_validity_threshold(error_count, valid):
    records = [failed() for _ in range(error_count)] + [done([1.0]) for _ in range(10 - error_count)]
    metrics = compute_metrics(records, 1.0)
    assert metrics.error_rate == pytest.approx(error_count / 10)
    assert metrics.valid is valid


def test_goodput_each_side_of_each_target():
    slo = Slo(ttft_s=1.0, tpot_s=0.5)
    records = [
        done([1.0, 1.5, 2.0]),  # TTFT 1.0, TPOT 0.5: both exactly on target (<=): good, 3 tokens
        done([0.5, 0.9]),  # TTFT 0.5, TPOT 0.4: good, 2 tokens
        done([1.1, 1.2]),  # TTFT misses
        done([0.5, 1.2]),  # TPOT 0.7 misses
        done([2.0]),  # TTFT misses, no TPOT
        done([0.2]),  # one token, TTFT fine: no TPOT means no TPOT miss: good, 1 token
        failed(times=[0.1, 0.2]),  # fast but failed: never good
    ]
    metrics = compute_metrics(records, duration_s=2.0, slo=slo)
    assert metrics.goodput_rps == pytest.approx(3 / 2)
    assert metrics.token_goodput_per_s == pytest.approx((3 + 2 + 1) / 2)
    assert metrics.requests_per_s == pytest.approx(6 / 2)
    only_ttft = compute_metrics(records, 2.0, Slo(ttft_s=1.0))
    assert only_ttft.goodput_rps == pytest.approx(4 / 2)  # the TPOT miss is good now
    only_tpot = compute_metrics(records, 2.0, Slo(tpot_s=0.5))
    assert only_tpot.goodput_rps == pytest.approx(5 / 2)
    assert compute_metrics(records, 2.0).goodput_rps == pytest.approx(6 / 2)  # no targets: completed


def test_warmup_is_excluded():
    warm = done([9.0, 19.0], session="w", cached=100, warmup=True)
    warm_failure = failed(warmup=True)
    metrics = compute_metrics([warm, warm_failure, done([1.0, 1.5, 2.0])], 1.0)
    assert (metrics.completed, metrics.failed, metrics.error_rate) == (1, 0, 0.0)
    assert metrics.ttft.max == 1.0 and metrics.output_tokens == 3
    assert "w" not in metrics.cache_hit_rate_by_session and metrics.cached_token_ratio == 0.0


def test_cache_hit_rate_per_session():
    records = [
        done([1.0], session="a", input_tokens=100, cached=0),
        done([1.0], session="a", turn=1, input_tokens=300, cached=200),
        done([1.0], session="b", input_tokens=100, cached=100),
        failed(),  # session "f": its prompt is not counted
    ]
    metrics = compute_metrics(records, 1.0)
    assert metrics.cache_hit_rate_by_session == pytest.approx({"a": 200 / 400, "b": 1.0})
    assert metrics.cached_token_ratio == pytest.approx(300 / 500)  # Σcached / Σinput, not a mean of ratios
    assert metrics.session_cache_hit_rate.mean == pytest.approx(0.75)


def test_percentiles_by_hand():
    # numpy linear: rank q/100 * (n - 1) into the sorted values, interpolated.
    dist = Distribution.of([4.0, 1.0, 3.0, 2.0])
    assert (dist.count, dist.mean, dist.min, dist.max) == (4, 2.5, 1.0, 4.0)
    assert dist.p50 == pytest.approx(2.5)  # rank 1.5
    assert dist.p90 == pytest.approx(3.7)  # rank 2.7
    assert dist.p99 == pytest.approx(3.97)  # rank 2.97
    assert dist.p99_9 == pytest.approx(3.997)  # rank 2.997
    ten = Distribution.of(range(1, 11))  # 1..10: ranks 4.5, 8.1, 8.91, 8.991
    assert (ten.p50, ten.p90, ten.p99, ten.p99_9) == pytest.approx((5.5, 9.1, 9.91, 9.991))
    assert Distribution.of([7.0]).p99_9 == 7.0
    assert dist.to_dict(1e3)["p90"] == pytest.approx(3700.0)


def test_itl_percentiles_pool_every_gap():
    # Gaps 0.1, 0.1 (first request) and 0.4 (second): pooled over gaps, not per request.
    metrics = compute_metrics([done([1.0, 1.1, 1.2]), done([1.0, 1.4])], 1.0)
    assert metrics.itl.count == 3 and metrics.itl.mean == pytest.approx(0.2)
    assert metrics.itl.p50 == pytest.approx(0.1) and metrics.itl.p90 == pytest.approx(0.34)


def test_no_completed_requests_gives_nan_not_errors():
    metrics = compute_metrics([failed(), failed()], duration_s=5.0)
    assert metrics.error_rate == 1.0 and not metrics.valid
    assert math.isnan(metrics.ttft.p50) and metrics.ttft.count == 0
    assert math.isnan(metrics.cached_token_ratio) and metrics.output_tokens_per_s == 0.0
    block = metrics.to_dict()
    assert block["ttft_ms"]["p50"] is None and block["cached_token_ratio"] is None
    empty = compute_metrics([], duration_s=0.0)
    assert math.isnan(empty.error_rate) and not empty.valid and math.isnan(empty.requests_per_s)


def test_to_dict_is_in_milliseconds():
    block = compute_metrics([done([1.0, 1.5, 2.0])], 4.0, Slo(1.0, 0.5)).to_dict()
    assert block["ttft_ms"]["p50"] == pytest.approx(1000.0) and block["tpot_ms"]["p99_9"] == pytest.approx(
        500.0
    )
    assert block["requests"] == {"completed": 1, "failed": 0}
    assert set(LoadMetrics.__dataclass_fields__) >= {"goodput_rps", "token_goodput_per_s", "valid"}


def test_levels_are_split_and_ordered():
    records = [
        done([1.0], concurrency=8),
        done([1.0], concurrency=2, start=5.0, end=7.0),
        done([6.0], concurrency=2, start=4.0, end=6.5),
        done([1.0], concurrency=2, warmup=True),
    ]
    levels = split_levels(records)
    assert list(levels) == [Level(2, None), Level(8, None)]
    assert len(levels[Level(2, None)]) == 2  # the warm-up one is gone
    assert span_s(levels[Level(2, None)]) == pytest.approx(7.0 - 4.0)
    assert Level(2, None).label == "concurrency 2" and Level(None, 0.5).label == "rate 0.5/s"
    assert Level(None, None).label == "all"
