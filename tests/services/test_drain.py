"""SIGTERM drains a worker: health NOT_SERVING and stats ``draining`` at once, new work refused with
UNAVAILABLE (the router's "try another worker"), work in flight finished (a running stream, and a
reservation whose state arrives after the signal), then exit 0."""

import signal
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto.baton.v1 import generation_pb2, workers_pb2, workers_pb2_grpc
from services.engine.engine_config import EngineConfig
from services.worker_config import WorkerConfig
from services.worker_server import WorkerServer
from tests.services.workers import running_workers

PROMPT = [(5 * i) % 83 + 4 for i in range(30)]
SAMPLING = generation_pb2.SamplingParameters(max_tokens=40, ignore_eos=True)


def health_of(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status


def refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as failure:
        call()
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "draining" in failure.value.details()
    return failure.value


def test_a_draining_decode_worker_refuses_new_work_finishes_what_it_holds_and_exits_0(tiny_checkpoint):
    flags = ("--dtype", "float32", "--grace-period", "60")
    with running_workers(tiny_checkpoint("k3"), ("decode", *flags), ("prefill", *flags)) as (decode, prefill):
        decode_stub = workers_pb2_grpc.DecodeWorkerStub(grpc.insecure_channel(decode.address))
        prefill_stub = workers_pb2_grpc.PrefillWorkerStub(grpc.insecure_channel(prefill.address))
        local = workers_pb2.LocalPrefill(prompt_ids=PROMPT, sampling=SAMPLING)
        running = decode_stub.Decode(workers_pb2.DecodeRequest(request_id="running", local_prefill=local))
        first = next(running)  # decoding
        # The reservation lives while this lease stream is open; the Decode call below takes it over.
        lease = decode_stub.Reserve(
            workers_pb2.ReserveRequest(request_id="arriving", prompt_ids=PROMPT, sampling=SAMPLING),
            timeout=60,
        )
        reserved = next(lease)

        decode.worker.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30  # a signal to a process starved on a loaded machine
        while not decode_stub.Stats(workers_pb2.StatsRequest(), timeout=10).draining:
            assert time.monotonic() < deadline, "no draining flag after SIGTERM"
            time.sleep(0.05)
        assert health_of(decode.address) == health_pb2.HealthCheckResponse.NOT_SERVING
        new = workers_pb2.ReserveRequest(request_id="new", prompt_ids=PROMPT)
        refused(lambda: next(decode_stub.Reserve(new, timeout=10)))  # a draining worker opens no lease
        late = workers_pb2.DecodeRequest(request_id="new-local", local_prefill=local)
        refused(lambda: list(decode_stub.Decode(late, timeout=10)))

        # The reservation made before the signal is still filled and decoded.
        handed = prefill_stub.Prefill(
            workers_pb2.PrefillRequest(
                reservation=reserved.reservation,
                endpoint=reserved.endpoint,
                prompt_ids=PROMPT,
                sampling=SAMPLING,
            ),
            timeout=60,
        )
        arriving = list(
            decode_stub.Decode(
                workers_pb2.DecodeRequest(request_id="arriving", first_token_id=handed.first_token_id),
                timeout=60,
            )
        )
        rest = list(running)
        for messages in ([first, *rest], arriving):
            assert sum(len(m.token_ids) for m in messages) == 40
            assert messages[-1].finish_reason == generation_pb2.FINISH_REASON_LENGTH
        assert decode.worker.process.wait(timeout=30) == 0


def test_a_draining_prefill_worker_refuses_prefills(tiny_checkpoint):
    engine = EngineConfig(model=str(tiny_checkpoint("k3")), dtype="float32")
    server = WorkerServer(WorkerConfig(role="prefill", engine=engine, transfer_backend="grpc_bytes"))
    try:
        started = time.monotonic()
        assert server.drain()  # nothing in flight: done at once
        assert time.monotonic() - started < 5
        address = f"127.0.0.1:{server.port}"
        assert health_of(address) == health_pb2.HealthCheckResponse.NOT_SERVING
        with grpc.insecure_channel(address) as channel:
            stub = workers_pb2_grpc.PrefillWorkerStub(channel)
            assert stub.Stats(workers_pb2.StatsRequest(), timeout=10).draining
            reservation = workers_pb2.CacheReservation(request_id="late", block_ids=[0, 1], slot=0)
            endpoint = workers_pb2.TransferEndpoint(backend="grpc_bytes")
            late = workers_pb2.PrefillRequest(reservation=reservation, endpoint=endpoint, prompt_ids=PROMPT)
            error = refused(lambda: stub.Prefill(late, timeout=10))
            assert "Prefill refused" in error.details()
    finally:
        server.stop()


def test_past_its_grace_period_a_decode_worker_ends_its_streams_and_frees_what_it_held(tiny_checkpoint):
    engine = EngineConfig(model=str(tiny_checkpoint("k3")), dtype="float32")
    config = WorkerConfig(
        role="decode", engine=engine, transfer_backend="grpc_bytes", grace_period_s=0.0, release_grace_s=0.5
    )
    server = WorkerServer(config)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    stub = workers_pb2_grpc.DecodeWorkerStub(channel)
    try:
        long = workers_pb2.LocalPrefill(
            prompt_ids=PROMPT, sampling=generation_pb2.SamplingParameters(max_tokens=1000, ignore_eos=True)
        )
        running = stub.Decode(workers_pb2.DecodeRequest(request_id="running", local_prefill=long), timeout=60)
        next(running)  # decoding
        lease = stub.Reserve(
            workers_pb2.ReserveRequest(request_id="leased", prompt_ids=PROMPT, sampling=SAMPLING), timeout=60
        )
        next(lease)  # a reservation whose state has not come yet

        assert not server.drain()  # grace period 0: over at once, with both still there
        with pytest.raises(grpc.RpcError) as ended:
            list(running)
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE and "grace period" in ended.value.details()
        # Past the grace period nothing starts: the router moves the request and ends its lease.
        claim = workers_pb2.DecodeRequest(request_id="leased", first_token_id=1)
        with pytest.raises(grpc.RpcError) as late:
            list(stub.Decode(claim, timeout=10))
        assert late.value.code() == grpc.StatusCode.UNAVAILABLE and "grace period" in late.value.details()
        lease.cancel()

        deadline = time.monotonic() + 10
        while True:
            state = stub.CheckIntegrity(workers_pb2.IntegrityRequest(), timeout=10)
            held = (state.used_blocks, state.used_slots, state.running, state.waiting, state.reserved)
            if state.ok and held == (0, 0, 0, 0, 0) and not state.request_ids:
                break
            assert time.monotonic() < deadline, f"still held after the grace period: {state}"
            time.sleep(0.05)
    finally:
        channel.close()
        server.stop()
