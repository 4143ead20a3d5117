"""Workers that pause at every phase of a request (``--fault-delay``), so a test can cancel, time out or
kill exactly there, and a router factory over any workers."""

import pytest

from tests.services.routers import router_factory
from tests.services.workers import running_workers

PHASE_S = 1.0  # each injected pause: long enough to land a cancel in it on a loaded machine
GRACE_S = 1.0  # decode's --release-grace-s: how long a released reservation waits for a late write


@pytest.fixture(scope="package")
def model(tiny_checkpoint):
    return tiny_checkpoint("k3")


@pytest.fixture(scope="package")
def slow(model):
    """``(decode, prefill)``: decode pauses before reserving and before decoding starts; prefill before
    computing and before its write into decode."""
    pause = [f"--fault-delay={phase}={PHASE_S}" for phase in ("reserve", "decode_start")]
    prefill_pause = [f"--fault-delay={phase}={PHASE_S}" for phase in ("prefill", "handoff")]
    decode = ("decode", "--dtype", "float32", "--release-grace-s", str(GRACE_S), *pause)
    with running_workers(model, decode, ("prefill", "--dtype", "float32", *prefill_pause)) as started:
        yield tuple(started)


@pytest.fixture
def router_over(model):
    """``router_over(prefill_workers, decode_workers, **RouterConfig options) -> Router``, in-process
    (every prompt handed off unless told otherwise)."""
    with router_factory(model, disaggregation="always") as make:
        yield make
