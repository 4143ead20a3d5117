"""The router over real worker processes: public Generate equals the offline engine, route and usage set,
bad input answered with INVALID_ARGUMENT naming the field."""

import time
from typing import NamedTuple
from urllib.request import urlopen

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proto.baton.v1 import generation_pb2, generation_pb2_grpc, workers_pb2_grpc
from router.server import RouterConfig, RouterServer
from services.engine import LLM, SamplingParams
from tests.services.workers import running_workers


class Cluster(NamedTuple):
    model: object
    stub: generation_pb2_grpc.GenerationStub
    decode: workers_pb2_grpc.DecodeWorkerStub
    metrics_url: str
    prefill_address: str
    decode_address: str


@pytest.fixture(scope="module")
def cluster(tiny_checkpoint):
    model = tiny_checkpoint("kimi_linear")
    flags = ("--dtype", "float32")
    with running_workers(model, ("decode", *flags), ("prefill", *flags)) as (decode, prefill):
        router = RouterServer(
            RouterConfig(
                model=str(model),
                prefill=(prefill.address,),
                decode=(decode.address,),
                port=0,
                disaggregation="always",
            )
        )
        channel = grpc.insecure_channel(f"127.0.0.1:{router.port}")
        decode_channel = grpc.insecure_channel(decode.address)
        yield Cluster(
            model,
            generation_pb2_grpc.GenerationStub(channel),
            workers_pb2_grpc.DecodeWorkerStub(decode_channel),
            f"http://127.0.0.1:{router.metrics_port}/metrics",
            prefill.address,
            decode.address,
        )
        decode_channel.close()
        channel.close()
        router.stop()


def generate(stub, **fields):
    return list(stub.Generate(generation_pb2.GenerateRequest(**fields), timeout=120))


def test_greedy_through_the_cluster_equals_the_offline_engine(cluster):
    model, stub, *_ = cluster
    prompt = list(range(40, 90))
    sampling = generation_pb2.SamplingParameters(max_tokens=5, ignore_eos=True, logprobs=0)
    messages = generate(
        stub, token_ids=generation_pb2.TokenIds(ids=prompt), sampling=sampling, session_id="s1"
    )
    tokens = [t for m in messages for t in m.token_ids]
    want = LLM(str(model), dtype="float32").generate(
        [prompt], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    )[0]
    assert tokens == want.token_ids
    final = messages[-1]
    assert final.finish_reason == generation_pb2.FINISH_REASON_LENGTH
    assert final.route.transfer_backend == "nixl" and final.route.transfer_bytes > 0
    assert final.route.prefill_worker and final.route.decode_worker == "decode-test"
    assert final.usage.prompt_tokens == len(prompt) and final.usage.completion_tokens == 5
    assert len([p for m in messages for p in m.logprobs]) == 5


def test_text_prompt_streams_text(cluster):
    _, stub, *_ = cluster
    messages = generate(
        stub, text="Hello Baton", sampling=generation_pb2.SamplingParameters(max_tokens=4, ignore_eos=True)
    )
    assert sum(len(m.token_ids) for m in messages) == 4 and "".join(m.text for m in messages)


@pytest.mark.parametrize(
    "fields, words",
    [
        ({}, "prompt: give text, token_ids or chat"),
        ({"token_ids": generation_pb2.TokenIds(ids=[1, 99999])}, "token_ids: id 99999"),
        ({"text": "hi", "sampling": generation_pb2.SamplingParameters(top_p=1.5)}, "sampling.top_p"),
        ({"text": "hi", "model": "other"}, "model: 'other' is not served here"),
    ],
    ids=["no-prompt", "out-of-vocab", "bad-top-p", "unknown-model"],
)
def test_bad_requests_are_invalid_argument(cluster, fields, words):
    _, stub, *_ = cluster
    with pytest.raises(grpc.RpcError) as caught:
        generate(stub, **fields)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in caught.value.details()


def test_tokenize_and_list_models(cluster):
    model, stub, *_ = cluster
    ids = stub.Tokenize(generation_pb2.TokenizeRequest(text="Hello"), timeout=10).token_ids
    assert len(ids) >= 2
    models = stub.ListModels(generation_pb2.ListModelsRequest(), timeout=10).models
    assert [(m.id, m.family) for m in models] == [(model.name, "kimi_linear")]


def _decode_idle(stub, timeout_s=30.0) -> bool:
    from proto.baton.v1 import workers_pb2

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = stub.Stats(workers_pb2.StatsRequest(), timeout=10)
        if (
            stats.running == 0
            and stats.free_blocks == stats.total_blocks
            and stats.free_slots == stats.total_slots
        ):
            return True
        time.sleep(0.2)
    return False


def test_client_cancel_mid_stream_frees_the_decode_worker(cluster):
    _, stub, decode_stub, *_ = cluster
    sampling = generation_pb2.SamplingParameters(max_tokens=4000, ignore_eos=True)
    call = stub.Generate(
        generation_pb2.GenerateRequest(token_ids=generation_pb2.TokenIds(ids=[1, 2, 3]), sampling=sampling),
        timeout=120,
    )
    received = 0
    for message in call:
        received += len(message.token_ids)
        if received >= 3:
            call.cancel()
            break
    assert received >= 3
    assert _decode_idle(decode_stub, timeout_s=3.0), "the decode worker still holds the cancelled request"


def test_deadline_exceeded_frees_resources(cluster):
    _, stub, decode_stub, *_ = cluster
    sampling = generation_pb2.SamplingParameters(max_tokens=4000, ignore_eos=True)
    with pytest.raises(grpc.RpcError) as caught:
        list(
            stub.Generate(
                generation_pb2.GenerateRequest(
                    token_ids=generation_pb2.TokenIds(ids=[4, 5, 6]), sampling=sampling
                ),
                timeout=1.5,
            )
        )
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert _decode_idle(decode_stub, timeout_s=3.0), "the decode worker still holds the expired request"


def test_router_exports_latency_outcome_and_transfer_metrics(cluster):
    _, stub, _, metrics_url, *_ = cluster
    generate(
        stub,
        token_ids=generation_pb2.TokenIds(ids=[7, 8, 9]),
        sampling=generation_pb2.SamplingParameters(max_tokens=3, ignore_eos=True),
    )
    with pytest.raises(grpc.RpcError):
        generate(stub)
    families = {
        family.name: family for family in text_string_to_metric_families(urlopen(metrics_url).read().decode())
    }
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples
    }
    assert samples[("baton_time_to_first_token_seconds_count", ())] >= 1
    assert samples[("baton_time_per_output_token_seconds_count", ())] >= 1
    assert samples[("baton_e2e_request_latency_seconds_count", ())] >= 1
    assert samples[("baton_request_queue_time_seconds_count", ())] >= 1
    assert samples[("baton_requests_total", (("status", "length"),))] >= 1
    assert samples[("baton_requests_total", (("status", "invalid_argument"),))] >= 1
    assert samples[("baton_transfer_bytes_total", (("backend", "nixl"),))] > 0
    assert samples[("baton_generation_tokens_total", ())] >= 3
    assert samples[("baton_router_inflight_requests_limit", ())] == 256  # admission gauges


def test_queue_full_is_resource_exhausted_and_recovers(cluster):
    """A second router over the same workers, one seat and no queue: a concurrent request is refused."""
    small = RouterServer(
        RouterConfig(
            model=str(cluster.model),
            prefill=(cluster.prefill_address,),
            decode=(cluster.decode_address,),
            port=0,
            max_running=1,
            max_queued=0,
        )
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{small.port}")
    stub = generation_pb2_grpc.GenerationStub(channel)
    try:
        long = stub.Generate(
            generation_pb2.GenerateRequest(
                token_ids=generation_pb2.TokenIds(ids=[1, 2]),
                sampling=generation_pb2.SamplingParameters(max_tokens=4000, ignore_eos=True),
            ),
            timeout=60,
        )
        next(long)  # the first request holds the only seat
        with pytest.raises(grpc.RpcError) as caught:
            generate(stub, token_ids=generation_pb2.TokenIds(ids=[3, 4]))
        assert (
            caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            and "queue full" in caught.value.details()
        )
        long.cancel()
        for _ in range(50):  # the seat comes back once the cancelled call has unwound
            try:
                assert generate(
                    stub,
                    token_ids=generation_pb2.TokenIds(ids=[3, 4]),
                    sampling=generation_pb2.SamplingParameters(max_tokens=2),
                )[-1].finish_reason
                break
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                time.sleep(0.1)
        else:
            pytest.fail("the router never admitted a request again")
        assert _decode_idle(cluster.decode, timeout_s=5.0)
    finally:
        channel.close()
        small.stop()
