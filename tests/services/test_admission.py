"""The router's admission control: seats, a bounded queue, and the gauges that follow them."""

import threading
import time

import pytest

from common.errors import NoCapacity
from common.metrics import Metrics
from router.admission import Admission


def gauges(metrics: Metrics) -> dict[str, float]:
    names = (
        "baton_router_inflight_requests",
        "baton_router_inflight_requests_limit",
        "baton_router_queued_requests",
        "baton_router_queued_requests_limit",
    )
    return {name.removeprefix("baton_router_"): metrics.registry.get_sample_value(name) for name in names}


def wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.01)


def test_gauges_follow_seats_and_queue():
    metrics = Metrics("router")
    admission = Admission(max_running=1, max_queued=1, metrics=metrics)
    limits = {"inflight_requests_limit": 1, "queued_requests_limit": 1}
    assert gauges(metrics) == {"inflight_requests": 0, "queued_requests": 0, **limits}
    admission.enter(timeout_s=1)
    assert gauges(metrics) == {"inflight_requests": 1, "queued_requests": 0, **limits}

    waiter = threading.Thread(target=admission.enter, args=(10,))
    waiter.start()
    wait_for(lambda: gauges(metrics)["queued_requests"] == 1)
    with pytest.raises(NoCapacity, match="router queue full"):
        admission.enter(timeout_s=1)
    assert gauges(metrics) == {"inflight_requests": 1, "queued_requests": 1, **limits}

    admission.leave()  # the waiter takes the seat
    waiter.join(timeout=5)
    assert gauges(metrics) == {"inflight_requests": 1, "queued_requests": 0, **limits}
    admission.leave()
    assert gauges(metrics) == {"inflight_requests": 0, "queued_requests": 0, **limits}


def test_deadline_while_queued_leaves_the_gauges_clean():
    metrics = Metrics("router")
    admission = Admission(max_running=1, max_queued=4, metrics=metrics)
    admission.enter(timeout_s=None)
    with pytest.raises(TimeoutError, match="router queue"):
        admission.enter(timeout_s=0.05)
    assert gauges(metrics)["queued_requests"] == 0 and gauges(metrics)["inflight_requests"] == 1
    admission.leave()
    assert gauges(metrics)["inflight_requests"] == 0


def test_without_metrics_and_bad_limits():
    admission = Admission(max_running=2, max_queued=0)
    admission.enter(timeout_s=None)
    admission.leave()
    with pytest.raises(ValueError, match="max_running"):
        Admission(max_running=0, max_queued=0)
