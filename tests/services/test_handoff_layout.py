"""A prefill worker checks the layout a decode reservation carries before computing anything: a
mismatch is INVALID_ARGUMENT naming the field and both sides, and neither worker keeps anything. A
decode worker refuses at Reserve a sender (its fed layout) that could not write into it."""

import dataclasses

import grpc
import pytest

from proto.baton.v1 import generation_pb2, workers_pb2, workers_pb2_grpc
from services.engine.engine_config import EngineConfig
from services.worker_config import WorkerConfig
from services.worker_server import WorkerServer

PROMPT = list(range(30, 71))
SAMPLING = generation_pb2.SamplingParameters(max_tokens=2)


@pytest.fixture(scope="module")
def servers(tiny_checkpoint):
    """A decode worker in batch-invariant mode and two prefill workers: one like it, one in default mode."""
    engine = EngineConfig(model=str(tiny_checkpoint("k3")), dtype="float32")
    invariant = dataclasses.replace(engine, batch_invariant=True)
    configs = [
        WorkerConfig(role="decode", engine=invariant, transfer_backend="grpc_bytes", name="decode-l"),
        WorkerConfig(role="prefill", engine=invariant, transfer_backend="grpc_bytes", name="prefill-same"),
        WorkerConfig(role="prefill", engine=engine, transfer_backend="grpc_bytes", name="prefill-default"),
    ]
    started, channels = [], []
    try:
        for config in configs:
            started.append(WorkerServer(config))
            channels.append(grpc.insecure_channel(f"127.0.0.1:{started[-1].port}"))
        yield (
            workers_pb2_grpc.DecodeWorkerStub(channels[0]),
            workers_pb2_grpc.PrefillWorkerStub(channels[1]),
            workers_pb2_grpc.PrefillWorkerStub(channels[2]),
        )
    finally:
        for channel in channels:
            channel.close()
        for server in started:
            server.stop()


def refused_prefill(prefill, reserved, reservation) -> grpc.RpcError:
    request = workers_pb2.PrefillRequest(
        reservation=reservation, endpoint=reserved.endpoint, prompt_ids=PROMPT, sampling=SAMPLING
    )
    with pytest.raises(grpc.RpcError) as caught:
        prefill.Prefill(request, timeout=60)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    return caught.value


def holds_nothing(*stubs) -> None:
    for stub in stubs:
        state = stub.CheckIntegrity(workers_pb2.IntegrityRequest(), timeout=10)
        assert state.ok, state.error
        assert (state.used_blocks, state.used_slots, state.running, state.waiting) == (0, 0, 0, 0)
        assert (state.reserved, state.held, list(state.request_ids)) == (0, 0, [])


@pytest.mark.parametrize(
    "tamper, field, decode_side, prefill_side",
    [
        (lambda layout: setattr(layout, "dtype", "float16"), "dtype", "float16", "float32"),
        (lambda layout: setattr(layout, "block_size", 32), "block_size", "32", "16"),
        (lambda layout: setattr(layout, "model", "other-model"), "model", "other-model", ""),
        (lambda layout: layout.Clear(), "", "", ""),
    ],
    ids=["dtype", "block-size", "model", "absent"],
)
def test_a_reservation_laid_out_otherwise_is_refused_naming_the_field(
    servers, tamper, field, decode_side, prefill_side
):
    decode, prefill, _ = servers
    request_id = f"tampered-{field or 'absent'}"
    lease = decode.Reserve(workers_pb2.ReserveRequest(request_id=request_id, prompt_ids=PROMPT), timeout=60)
    reserved = next(lease)
    reservation = workers_pb2.CacheReservation()
    reservation.CopyFrom(reserved.reservation)
    tamper(reservation.layout)
    if not field:
        reservation.ClearField("layout")
    details = refused_prefill(prefill, reserved, reservation).details()
    if field:
        assert details.startswith(f"reservation.layout.{field}: decode worker has {decode_side}, ")
        assert f"this prefill worker has {prefill_side}" in details
    else:
        assert details.startswith("reservation.layout: required")
    decode.Release(workers_pb2.ReleaseRequest(request_id=request_id, no_handoff_in_flight=True), timeout=10)
    assert list(lease) == []
    holds_nothing(decode, prefill)


def test_a_prefill_worker_in_other_numerics_refuses_then_a_matching_one_hands_off(servers):
    decode, same, default = servers
    lease = decode.Reserve(workers_pb2.ReserveRequest(request_id="mixed", prompt_ids=PROMPT), timeout=60)
    reserved = next(lease)
    details = refused_prefill(default, reserved, reserved.reservation).details()
    # The CF-BI open-chunk rows make the slot layouts differ before the numerics field is reached.
    assert details.startswith("reservation.layout.slot_layout: decode worker has "), details
    holds_nothing(default)
    first = same.Prefill(
        workers_pb2.PrefillRequest(
            reservation=reserved.reservation, endpoint=reserved.endpoint, prompt_ids=PROMPT, sampling=SAMPLING
        ),
        timeout=120,
    )
    decoded = list(
        decode.Decode(
            workers_pb2.DecodeRequest(request_id="mixed", first_token_id=first.first_token_id), timeout=120
        )
    )
    assert decoded[-1].finish_reason == generation_pb2.FINISH_REASON_LENGTH
    assert list(lease) == []
    holds_nothing(decode, same, default)


def fed_layout(stub) -> workers_pb2.CacheLayout:
    """The handoff layout a worker's load feed reports on its first (full) picture."""
    feed = stub.WatchLoad(workers_pb2.WatchLoadRequest(), timeout=30)
    first = next(feed)
    feed.cancel()
    assert first.full and first.HasField("layout")
    return first.layout


def test_the_decode_worker_refuses_a_sender_it_cannot_take_at_reserve(servers):
    decode, same, default = servers
    assert fed_layout(decode) == fed_layout(same), "equal engines report equal layouts"
    request = workers_pb2.ReserveRequest(
        request_id="sender", prompt_ids=PROMPT, prefill_layout=fed_layout(default)
    )
    with pytest.raises(grpc.RpcError) as caught:
        next(decode.Reserve(request, timeout=60))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("prefill_layout: cannot write into this decode worker: ")
    assert "reservation.layout.slot_layout" in caught.value.details()
    holds_nothing(decode)  # refused before any room was held
    request.prefill_layout.CopyFrom(fed_layout(same))
    lease = decode.Reserve(request, timeout=60)
    assert len(next(lease).reservation.block_ids) > 0
    decode.Release(workers_pb2.ReleaseRequest(request_id="sender", no_handoff_in_flight=True), timeout=10)
    assert list(lease) == []
    holds_nothing(decode)
