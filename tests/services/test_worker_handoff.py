"""Real prefill and decode worker processes: gRPC calls, NIXL handoff, tokens equal the offline engine."""

import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto.baton.v1 import generation_pb2, workers_pb2, workers_pb2_grpc
from services.engine import LLM, SamplingParams
from tests.services.workers import WorkerProcess

PROMPT = list(range(30, 71))


@pytest.fixture(scope="module")
def workers(tiny_checkpoint):
    model = tiny_checkpoint("k3")
    decode = WorkerProcess("decode", model, "--batch-invariant", "--dtype", "float32")
    try:
        prefill = WorkerProcess("prefill", model, "--batch-invariant", "--dtype", "float32")
    except Exception:
        decode.stop()
        raise
    channels = [grpc.insecure_channel(w.address) for w in (decode, prefill)]
    yield (
        model,
        workers_pb2_grpc.DecodeWorkerStub(channels[0]),
        workers_pb2_grpc.PrefillWorkerStub(channels[1]),
        channels,
    )
    for channel in channels:
        channel.close()
    prefill.stop()
    decode.stop()


def reserve(decode, request_id, prompt, **fields):
    """``(ReserveResponse, lease)``: the reservation lives while the lease stream is open."""
    lease = decode.Reserve(
        workers_pb2.ReserveRequest(request_id=request_id, prompt_ids=prompt, **fields), timeout=60
    )
    return next(lease), lease


def disaggregated(decode, prefill, request_id, prompt, sampling):
    reserved, lease = reserve(decode, request_id, prompt, sampling=sampling)
    first = prefill.Prefill(
        workers_pb2.PrefillRequest(
            reservation=reserved.reservation, endpoint=reserved.endpoint, prompt_ids=prompt, sampling=sampling
        ),
        timeout=120,
    )
    decoded = list(
        decode.Decode(
            workers_pb2.DecodeRequest(
                request_id=request_id, first_token_id=first.first_token_id, first_logprob=first.first_logprob
            ),
            timeout=120,
        )
    )
    assert list(lease) == [], "the lease ends once Decode has taken the reservation over"
    return reserved, first, decoded


def test_disaggregated_tokens_and_logprobs_equal_the_offline_engine(workers):
    model, decode, prefill, _ = workers
    sampling = generation_pb2.SamplingParameters(max_tokens=6, ignore_eos=True, logprobs=0)
    reserved, first, decoded = disaggregated(decode, prefill, "r1", PROMPT, sampling)
    assert reserved.endpoint.backend == "nixl" and first.transfer_bytes > 0
    tokens = [t for message in decoded for t in message.token_ids]
    logprobs = [p for message in decoded for p in message.logprobs]
    final = decoded[-1]
    assert (
        final.finish_reason == generation_pb2.FINISH_REASON_LENGTH
        and final.route.decode_worker == "decode-test"
    )
    assert final.usage.prompt_tokens == len(PROMPT) and final.usage.completion_tokens == 6
    want = LLM(str(model), batch_invariant=True, dtype="float32").generate(
        [PROMPT], SamplingParams(max_tokens=6, temperature=0, logprobs=0, ignore_eos=True)
    )[0]
    assert tokens == want.token_ids
    as_bits = np.asarray(logprobs, dtype=np.float32).view(np.int32)
    assert as_bits.tolist() == np.asarray(want.logprobs, dtype=np.float32).view(np.int32).tolist()


def test_bad_inputs_get_clear_statuses_and_the_workers_keep_serving(workers):
    _, decode, prefill, channels = workers
    bad = generation_pb2.SamplingParameters(temperature=-1.0)
    with pytest.raises(grpc.RpcError) as caught:
        reserve(decode, "bad", [1], sampling=bad)
    assert (
        caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        and "sampling.temperature" in caught.value.details()
    )
    with pytest.raises(grpc.RpcError) as caught:
        reserve(decode, "oov", [1, 10**6])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "prompt_ids" in caught.value.details()
    with pytest.raises(grpc.RpcError) as caught:
        prefill.Prefill(workers_pb2.PrefillRequest(prompt_ids=[1]), timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "request_id" in caught.value.details()
    for channel in channels:
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert status.status == health_pb2.HealthCheckResponse.SERVING
    stats = decode.Stats(workers_pb2.StatsRequest(), timeout=10)
    assert stats.running == 0 and stats.free_blocks == stats.total_blocks
    _, _, decoded = disaggregated(
        decode, prefill, "after", [5, 6, 7], generation_pb2.SamplingParameters(max_tokens=2)
    )
    assert decoded[-1].finish_reason != generation_pb2.FINISH_REASON_UNSPECIFIED


def test_release_with_no_handoff_in_flight_frees_a_reservation_at_once(workers):
    _, decode, _, _ = workers
    _, lease = reserve(decode, "dropped", PROMPT)
    busy = decode.Stats(workers_pb2.StatsRequest(), timeout=10)
    assert busy.running == 1 and busy.free_blocks < busy.total_blocks
    decode.Release(workers_pb2.ReleaseRequest(request_id="dropped", no_handoff_in_flight=True), timeout=10)
    idle = decode.Stats(workers_pb2.StatsRequest(), timeout=10)
    assert idle.running == 0 and idle.free_blocks == idle.total_blocks
    assert list(lease) == [], "a released reservation's lease ends"


def test_release_keeps_a_reservation_a_prefill_may_still_write_until_the_grace_ends(workers):
    _, decode, _, _ = workers
    _, lease = reserve(decode, "late", PROMPT)
    released_at = time.monotonic()
    decode.Release(workers_pb2.ReleaseRequest(request_id="late"), timeout=10)
    assert decode.Stats(workers_pb2.StatsRequest(), timeout=10).running == 1  # still held: a write may land
    while decode.Stats(workers_pb2.StatsRequest(), timeout=10).running:
        assert time.monotonic() - released_at < 15, "the reservation was never freed"
        time.sleep(0.2)
    assert time.monotonic() - released_at >= 4.5  # the grace period (5 s), not before
    idle = decode.Stats(workers_pb2.StatsRequest(), timeout=10)
    assert idle.free_blocks == idle.total_blocks


def test_check_integrity_shows_a_reservation_then_nothing_held(workers):
    _, decode, prefill, _ = workers
    reserved, lease = reserve(decode, "integrity-1", PROMPT)
    during = decode.CheckIntegrity(workers_pb2.IntegrityRequest(), timeout=10)
    assert during.ok and during.reserved == 1 and "integrity-1" in during.request_ids
    assert during.used_blocks == len(reserved.reservation.block_ids) and during.used_slots == 1
    decode.Release(
        workers_pb2.ReleaseRequest(request_id="integrity-1", no_handoff_in_flight=True), timeout=10
    )
    for stub in (decode, prefill):
        after = stub.CheckIntegrity(workers_pb2.IntegrityRequest(), timeout=10)
        assert after.ok, after.error
        assert (after.used_blocks, after.used_slots, after.reserved, after.held) == (0, 0, 0, 0)
        assert not after.request_ids and after.total_blocks > 0


def test_decode_keeps_its_own_hit_and_the_prefill_sends_only_the_rest(workers):
    model, decode, prefill, _ = workers
    sampling = generation_pb2.SamplingParameters(max_tokens=3, ignore_eos=True, logprobs=0)
    turn1 = [token + 300 for token in PROMPT]  # a prompt no other test of the module sends
    whole_reserved, whole, _ = disaggregated(decode, prefill, "turn-1", turn1, sampling)
    assert whole_reserved.reservation.cached_tokens == 0
    turn2 = turn1[:32] + list(range(100, 109))  # two blocks of 16 decode now holds, then new tokens
    reserved, first, decoded = disaggregated(decode, prefill, "turn-2", turn2, sampling)
    assert reserved.reservation.cached_tokens == 32
    assert 0 < first.transfer_bytes < whole.transfer_bytes  # one block and the slot, not three blocks
    assert decoded[-1].usage.cached_tokens >= 32
    want = LLM(str(model), batch_invariant=True, dtype="float32").generate(
        [turn2], SamplingParams(max_tokens=3, temperature=0, logprobs=0, ignore_eos=True)
    )[0]
    logprobs = [p for message in decoded for p in message.logprobs]
    assert [t for message in decoded for t in message.token_ids] == want.token_ids
    as_bits = np.asarray(logprobs, dtype=np.float32).view(np.int32)
    assert as_bits.tolist() == np.asarray(want.logprobs, dtype=np.float32).view(np.int32).tolist()

    forged, lease = reserve(decode, "forged", turn2, sampling=sampling)
    forged.reservation.cached_tokens = 7  # not whole blocks: refused before any prefill work
    with pytest.raises(grpc.RpcError) as caught:
        prefill.Prefill(
            workers_pb2.PrefillRequest(
                reservation=forged.reservation, endpoint=forged.endpoint, prompt_ids=turn2, sampling=sampling
            ),
            timeout=60,
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "reservation.cached_tokens" in caught.value.details()
    decode.Release(workers_pb2.ReleaseRequest(request_id="forged", no_handoff_in_flight=True), timeout=10)
    assert list(lease) == []
