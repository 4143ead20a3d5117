"""The router as its own process: it keeps answering while 100 clients drop their streams (cancellation
work never waits on gRPC's event thread), and when it is killed mid-request the workers free
everything it held, and it serves again once restarted."""

import json
import subprocess
import sys
import time

import grpc
import pytest

from deploy.benchmark.control_server import ControlServer
from tests.lifecycle.cluster import RouterProcess, assert_idle, integrity, prompt_of, request, wait_until
from tests.lifecycle.conftest import GRACE_S
from tests.lifecycle.test_cancel_points import Stream
from tests.services.workers import REPO


@pytest.fixture(scope="module")
def router(model, slow):
    decode, prefill = slow
    process = RouterProcess(model, [prefill], [decode], "--always-disaggregate")
    yield process
    process.stop()


class LatencyProbe:
    """``tests/lifecycle/latency_probe.py`` in its own process, probing the router on ``port`` and the
    control server on ``control_port`` until ``stop``."""

    def __init__(self, port: int, control_port: int):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.lifecycle.latency_probe", str(port), str(control_port)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout.readline().strip() == "PROBING"

    def stop(self) -> dict[str, float]:
        """The slowest router health Check, ListModels and control health Check seen (seconds), the
        rounds made and the late ones (``latency_probe``)."""
        out, _ = self.process.communicate(timeout=60)
        return json.loads(out)


def test_dropping_100_streams_keeps_health_and_list_models_fast(router, slow):
    decode, prefill = slow
    streams = [Stream(router.stub, prompt_of(24, i), 4000) for i in range(100)]
    # 64 decode seats: some streams decode, the others wait for room in the router queue.
    wait_until(lambda: sum(1 for s in streams if s.messages) >= 40, 60, "40 streams decoding")
    control = ControlServer()
    probe = LatencyProbe(router.port, control.port)
    time.sleep(0.2)
    dropped_at = time.monotonic()
    for stream in streams:
        stream.call.cancel()
    wait_until(lambda: router.metric("baton_router_inflight_requests") == 0, 5, "router seats freed")
    seats_freed = time.monotonic() - dropped_at
    assert_idle(decode, prefill, timeout_s=GRACE_S + 5)
    seconds = probe.stop()
    control.stop()
    print(f"100 dropped: router seats freed in {seats_freed:.2f} s; slowest calls {seconds}")
    # Before the fix the router's event thread did the cancellation work: these calls took 11.4 s with 60
    # dropped streams. Now it keeps answering through the drop: every call well under a second, and most
    # rounds within the 100 ms over an idle server probed in the same round. A busy process on a
    # saturated 2-core CI box is descheduled more than an idle one, so a few rounds may pass 100 ms (2 of
    # 26 did once, at 119 ms); the 100 ms figure itself is a benchmark's to report, not a timed test's.
    assert seconds["rounds"] >= 5 and seconds["late_rounds"] * 4 <= seconds["rounds"], seconds
    assert max(seconds["health"], seconds["list_models"]) < 1.0, seconds


@pytest.mark.parametrize("point", ["during_the_handoff_write", "during_decode"])
def test_a_killed_router_leaves_nothing_held_and_serves_again(router, slow, point):
    decode, prefill = slow
    stream = Stream(router.stub, prompt_of(40, 50), 4000)
    if point == "during_the_handoff_write":
        wait_until(lambda: integrity(prefill).held == 1, 30, point)
    else:
        wait_until(lambda: stream.messages, 30, point)
    router.kill()
    stream.thread.join(timeout=10)
    assert stream.error is not None and stream.error.code() == grpc.StatusCode.UNAVAILABLE
    took = assert_idle(decode, prefill, timeout_s=GRACE_S + 5)
    print(f"router killed {point}: workers idle after {took:.2f} s")
    router.start()
    messages = list(router.stub.Generate(request(prompt_of(40, 51), 3), timeout=60))
    assert sum(len(m.token_ids) for m in messages) == 3
    assert_idle(decode, prefill, timeout_s=5)
