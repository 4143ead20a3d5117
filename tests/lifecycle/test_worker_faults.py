"""Workers full or dying: a request waits in the router queue for decode room instead of failing; a
decode or prefill worker that dies mid-request leaves nothing held on the others; a worker that dies
with no traffic is marked down within seconds."""

import threading
import time

import grpc
import pytest

from tests.lifecycle.cluster import assert_idle, integrity, prompt_of, request, wait_until
from tests.lifecycle.conftest import PHASE_S
from tests.lifecycle.test_cancel_points import Stream
from tests.services.workers import running_workers


@pytest.fixture(scope="module")
def workers(model):
    """``(prefill, small_decode, spare_decode)``: prefill pauses before its write; small_decode has two
    seats; spare_decode is there to be killed."""
    flags = ("--dtype", "float32")
    specs = (
        ("prefill", *flags, f"--fault-delay=handoff={PHASE_S}"),
        ("decode", *flags, "--max-num-seqs", "2"),
        ("decode", *flags),
    )
    with running_workers(model, *specs) as started:
        yield tuple(started)


def test_when_every_decode_seat_is_taken_requests_wait_in_the_router_queue(workers, router_over):
    prefill, small_decode, _ = workers
    router = router_over([prefill], [small_decode])
    results, errors, queued = [], [], []

    def run(seed):
        try:
            results.append(list(router.stub.Generate(request(prompt_of(40, seed), 4), timeout=120)))
        except grpc.RpcError as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(60 + i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        queued.append(router.metric("baton_router_queued_requests"))
        time.sleep(0.05)
    assert [error.code() for error in errors] == []  # no RESOURCE_EXHAUSTED (429) with room in the queue
    assert len(results) == 6 and all(sum(len(m.token_ids) for m in r) == 4 for r in results)
    assert max(queued) >= 1, "with 2 decode seats for 6 requests, some waited in the router queue"
    assert router.metric("baton_router_queued_requests") == 0
    assert_idle(prefill, small_decode, timeout_s=5)


def test_a_decode_worker_dying_during_the_handoff_leaves_the_prefill_worker_empty(workers, router_over):
    prefill, _, spare_decode = workers
    router = router_over([prefill], [spare_decode])
    # Opted out of migration: with no other decode worker there is nowhere to move it, and the point
    # here is what the prefill worker keeps (tests/services/test_migration.py moves requests).
    stream = Stream(router.stub, prompt_of(40, 70), 50, no_migration=True)
    wait_until(lambda: integrity(prefill).held == 1, 30, "prefill holding its state for the handoff")
    spare_decode.worker.process.kill()
    stream.thread.join(timeout=30)
    assert stream.error is not None and stream.error.code() == grpc.StatusCode.UNAVAILABLE
    assert router.metric("baton_migrations_total", outcome="opted_out") == 1
    assert_idle(prefill, timeout_s=PHASE_S + 5)
    assert router.metric("baton_router_inflight_requests") == 0


def test_a_prefill_worker_dying_mid_handoff_is_replaced_by_a_local_prefill(workers, router_over):
    prefill, small_decode, _ = workers
    router = router_over([prefill], [small_decode])
    stream = Stream(router.stub, prompt_of(40, 80), 6)
    wait_until(lambda: integrity(prefill).held == 1, 30, "prefill holding its state for the handoff")
    prefill.worker.process.kill()
    stream.thread.join(timeout=60)
    assert stream.error is None and sum(len(m.token_ids) for m in stream.messages) == 6
    assert stream.messages[-1].route.prefill_worker == ""  # the decode worker prefilled it itself
    assert_idle(small_decode, timeout_s=5)


def test_a_worker_dying_without_traffic_is_marked_down_within_seconds(workers, router_over):
    _, small_decode, _ = workers
    router = router_over([], [small_decode], disaggregation="never")
    up = lambda: router.metric("baton_worker_up", role="decode", worker=small_decode.address)  # noqa: E731
    assert up() == 1
    small_decode.worker.process.kill()
    killed_at = time.monotonic()
    wait_until(lambda: up() == 0, 3, "baton_worker_up 0 after the kill, with no request sent")
    print(f"marked down {time.monotonic() - killed_at:.2f} s after the kill")
