"""Many clients leaving at random points: whatever point each had reached, the workers hold nothing
seconds later."""

import random
import time

from tests.lifecycle.cluster import assert_idle, prompt_of, wait_until
from tests.lifecycle.conftest import GRACE_S, PHASE_S
from tests.lifecycle.test_cancel_points import Stream


def test_50_streams_cancelled_at_random_points_leave_nothing_held(slow, router_over):
    decode, prefill = slow
    router = router_over([prefill], [decode], disaggregation="conditional")
    chance = random.Random(11)
    # Long prompts are handed off, short ones prefilled on decode; cancels spread over every phase.
    streams = [Stream(router.stub, prompt_of(chance.choice((8, 40, 70)), i), 4000) for i in range(50)]
    cancels = sorted(((chance.uniform(0, 5 * PHASE_S), stream) for stream in streams), key=lambda p: p[0])
    started = time.monotonic()
    for at, stream in cancels:
        time.sleep(max(0.0, at - (time.monotonic() - started)))
        stream.call.cancel()
    took = assert_idle(decode, prefill, timeout_s=GRACE_S + 5)
    wait_until(lambda: router.metric("baton_router_inflight_requests") == 0, 5, "router seats freed")
    # A client that cancels before its call reaches the router is never seen by it, so a few of the
    # earliest cancels may go uncounted; every request the router did see must count as cancelled.
    others = ("stop", "length", "abort", "unavailable", "deadline_exceeded", "internal", "unknown", "error")
    assert {
        status: router.metric("baton_requests_total", status=status) for status in others
    } == dict.fromkeys(others, 0.0)
    assert 45 <= router.metric("baton_requests_total", status="cancelled") <= 50
    print(f"storm: workers idle {took:.2f} s after the last cancel")
