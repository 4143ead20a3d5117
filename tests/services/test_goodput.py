"""Goodput: the router counts a finished request in ``baton_requests_slo_met_total`` only when its
TTFT and TPOT both met the targets (inclusive, like the histogram bucket ``le`` the alerts read)."""

from types import SimpleNamespace

import pytest

from common.metrics import Metrics
from proto.baton.v1 import generation_pb2
from router.admission import Admission
from router.servicer import GenerationServicer


class Clock:
    def __init__(self):
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


class FakeDispatcher:
    """Streams one token per gap (seconds after the previous message), then a LENGTH finish."""

    def __init__(self, clock: Clock, gaps: list[float], fail: bool = False):
        self.clock, self.gaps, self.fail = clock, gaps, fail

    def run(self, request_id, prompt_ids, request, context, route):
        for index, gap in enumerate(self.gaps):
            self.clock.now += gap
            message = generation_pb2.GenerateResponse(token_ids=[index + 1])
            if index == len(self.gaps) - 1:
                if self.fail:
                    raise TimeoutError("deadline passed in the decode worker")
                message.finish_reason = generation_pb2.FINISH_REASON_LENGTH
            yield message


class Context:
    def is_active(self) -> bool:
        return True

    def time_remaining(self):
        return None


def run_one(monkeypatch, gaps: list[float], fail: bool = False) -> Metrics:
    clock = Clock()
    monkeypatch.setattr("router.servicer.time", clock)
    metrics = Metrics("router")
    servicer = GenerationServicer(
        "tiny",
        SimpleNamespace(vocab_size=100, family="k3"),
        None,
        FakeDispatcher(clock, gaps, fail),
        4096,
        metrics,
        Admission(4, 4, metrics),
        slo_ttft_s=2.0,
        slo_tpot_s=0.1,
    )
    request = generation_pb2.GenerateRequest(token_ids=generation_pb2.TokenIds(ids=[1, 2, 3]))
    try:
        list(servicer.Generate(request, Context()))
    except TimeoutError:
        assert fail
    return metrics


@pytest.mark.parametrize(
    "gaps, fail, met",
    [
        ([0.5, 0.05, 0.05], False, 1),
        ([2.0, 0.1, 0.1], False, 1),  # exactly at both targets
        ([1.0], False, 1),  # one token: no TPOT to miss
        ([2.5, 0.01, 0.01], False, 0),
        ([0.5, 0.05, 0.25], False, 0),  # mean gap 0.15 s
        ([0.5, 0.05, 0.05], True, 0),  # fast, but it failed
    ],
    ids=["fast", "at-targets", "one-token", "slow-ttft", "slow-tpot", "failed"],
)
def test_slo_met_counts_only_requests_within_both_targets(monkeypatch, gaps, fail, met):
    metrics = run_one(monkeypatch, gaps, fail)
    assert metrics.registry.get_sample_value("baton_requests_slo_met_total") == met
    status = "deadline_exceeded" if fail else "length"
    assert metrics.registry.get_sample_value("baton_requests_total", {"status": status}) == 1
    assert metrics.registry.get_sample_value("baton_router_inflight_requests") == 0
