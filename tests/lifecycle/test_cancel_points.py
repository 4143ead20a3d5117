"""A client that cancels, or whose deadline passes, at any point of a disaggregated request leaves no
block, slot or request behind on any worker, within seconds (not the reservation TTL), and is counted as
cancelled (deadline_exceeded), not as a failure of the service.

The workers pause at each phase (``--fault-delay``, see conftest), and the test finds the phase from
the workers' own state (``CheckIntegrity``) before cancelling there."""

import threading
import time

import grpc
import pytest

from proto.baton.v1 import workers_pb2, workers_pb2_grpc
from tests.lifecycle.cluster import assert_idle, freed, integrity, prompt_of, request, wait_until
from tests.lifecycle.conftest import GRACE_S, PHASE_S

FREED_WITHIN_S = GRACE_S + 4.0


# Point -> whether the reservation is still the lease's (freed as caller_gone) or a Decode call's.
POINTS = {
    "before_reserve_returns": True,  # decode pauses before reserving: cancel during that pause
    "between_reserve_and_prefill": True,  # reserved; prefill pauses before computing
    "during_the_handoff_write": True,  # prefill done and holding its state; its write goes ahead anyway
    "between_handoff_and_first_decode_step": False,  # state written; decode pauses before starting
    "during_decode": False,  # tokens are streaming
}


class Stream:
    """One Generate on its own thread: ``messages`` as they come, ``error`` at the end."""

    def __init__(self, stub, prompt, max_tokens, timeout=120, no_migration=False):
        generate = request(prompt, max_tokens)
        generate.no_migration = no_migration
        self.call = stub.Generate(generate, timeout=timeout)
        self.messages, self.error = [], None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            for message in self.call:
                self.messages.append(message)
        except grpc.RpcError as error:
            self.error = error


def _reach(point, decode, prefill, stream):
    if point == "before_reserve_returns":
        time.sleep(PHASE_S / 3)
    elif point == "between_reserve_and_prefill":
        reserved = lambda state: state.reserved == 1 and state.leases == 1  # noqa: E731  (still the lease's)
        wait_until(lambda: reserved(integrity(decode)) and integrity(prefill).held == 0, 30, point)
    elif point == "during_the_handoff_write":
        wait_until(lambda: integrity(prefill).held == 1, 30, point)
    elif point == "between_handoff_and_first_decode_step":
        wait_until(lambda: integrity(prefill).held == 1, 30, "prefill done")
        # The Decode call has claimed the reservation (no lease left) and pauses before starting.
        claimed = lambda state: state.reserved == 1 and state.leases == 0  # noqa: E731
        wait_until(lambda: integrity(prefill).held == 0 and claimed(integrity(decode)), 30, point)
    else:
        wait_until(lambda: stream.messages, 30, point)
    assert stream.error is None and not any(m.finish_reason for m in stream.messages)


@pytest.mark.parametrize("point", POINTS)
def test_a_cancel_at_each_point_frees_everything(slow, router_over, point):
    decode, prefill = slow
    router = router_over([prefill], [decode])
    gone_before = freed(decode, "caller_gone")
    stream = Stream(router.stub, prompt_of(40, 20), 4000)
    _reach(point, decode, prefill, stream)
    stream.call.cancel()
    cancelled_at = time.monotonic()
    stream.thread.join(timeout=10)
    assert stream.error is not None and stream.error.code() == grpc.StatusCode.CANCELLED
    if POINTS[point]:  # the lease, not a Decode call, freed it (and it was there to free)
        wait_until(lambda: freed(decode, "caller_gone") == gone_before + 1, FREED_WITHIN_S, "lease ended")
    assert_idle(decode, prefill, timeout_s=FREED_WITHIN_S)
    took = time.monotonic() - cancelled_at
    wait_until(lambda: router.metric("baton_requests_total", status="cancelled") == 1, 5, "counted")
    assert router.metric("baton_requests_total", status="unavailable") == 0
    assert router.metric("baton_router_inflight_requests") == 0
    assert freed(decode, "caller_gone") == gone_before + POINTS[point]
    print(f"{point}: freed {took:.2f} s after the cancel")


def test_deadlines_anywhere_on_the_path_free_everything(slow, router_over):
    """Deadlines from 1 ms (before the router reaches decode) to past the first token: each lands at a
    different point of the path (the pauses above), concurrently."""
    decode, prefill = slow
    router = router_over([prefill], [decode])
    timeouts = (0.001, PHASE_S / 2, PHASE_S * 1.5, PHASE_S * 2.5, PHASE_S * 3.5, PHASE_S * 5)
    streams = [Stream(router.stub, prompt_of(40, 30 + i), 4000, timeout=t) for i, t in enumerate(timeouts)]
    for stream in streams:
        stream.thread.join(timeout=60)
        assert stream.error is not None and stream.error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert_idle(decode, prefill, timeout_s=FREED_WITHIN_S)
    # A call already past its deadline on arrival (1 ms) may never reach the router's handler.
    counted = lambda: router.metric("baton_requests_total", status="deadline_exceeded")  # noqa: E731
    wait_until(lambda: counted() >= len(timeouts) - 1, 5, "counted")
    assert router.metric("baton_requests_total", status="cancelled") == 0
    assert router.metric("baton_requests_total", status="unavailable") == 0


def test_a_flood_of_1ms_deadlines_holds_no_decode_seat(slow, router_over):
    """The denial of service of issue 11: 100-token prompts with a 1 ms deadline, 100 times. Every
    reservation they make is freed at once; a normal request is served right after, not refused."""
    decode, prefill = slow
    router = router_over([prefill], [decode], disaggregation="conditional")
    for seed in range(100):
        with pytest.raises(grpc.RpcError) as failure:
            list(router.stub.Generate(request(prompt_of(100, seed), 8), timeout=0.001))
        assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert_idle(decode, prefill, timeout_s=PHASE_S + FREED_WITHIN_S)
    messages = list(router.stub.Generate(request(prompt_of(100, 999), 3), timeout=60))
    assert sum(len(m.token_ids) for m in messages) == 3


def test_a_reservation_made_after_its_caller_left_is_freed_at_once(slow):
    """Decode reserves only after its pause, when the caller's 0.2 s deadline has passed: the answer
    cannot reach anyone, so no prefill can write there and the room is freed without a grace."""
    decode, _ = slow
    gone_before = freed(decode, "caller_gone")
    with grpc.insecure_channel(decode.address) as channel:
        lease = workers_pb2_grpc.DecodeWorkerStub(channel).Reserve(
            workers_pb2.ReserveRequest(request_id="late-caller", prompt_ids=prompt_of(40, 40)), timeout=0.2
        )
        with pytest.raises(grpc.RpcError) as failure:
            next(lease)
    assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_until(lambda: freed(decode, "caller_gone") == gone_before + 1, PHASE_S + 5, "reserved, then freed")
    assert_idle(decode, timeout_s=0.5)  # no grace: nothing was ever announced
