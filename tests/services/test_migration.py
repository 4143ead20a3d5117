"""Decode death mid-stream: the router moves the request to the other decode worker and the client's
stream goes on with exactly the tokens (and logprobs) of an undisturbed run, greedy or seeded."""

import time
from urllib.request import urlopen

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proto.baton.v1 import generation_pb2, generation_pb2_grpc, workers_pb2, workers_pb2_grpc
from router.server import RouterConfig, RouterServer
from tests.services.workers import running_workers

FLAGS = ("--batch-invariant", "--dtype", "float32")  # a re-prefilled token has a decoded one's bits
MAX_TOKENS = 160


@pytest.fixture(scope="module")
def cluster(tiny_checkpoint):
    model = tiny_checkpoint("k3")
    specs = (("decode", *FLAGS, "--name", "decode-a"), ("decode", *FLAGS, "--name", "decode-b"))
    with running_workers(model, *specs, ("prefill", *FLAGS)) as (decode_a, decode_b, prefill):
        router = RouterServer(
            RouterConfig(
                model=str(model),
                prefill=(prefill.address,),
                decode=(decode_a.address, decode_b.address),
                port=0,
                disaggregation="always",
            )
        )
        channel = grpc.insecure_channel(f"127.0.0.1:{router.port}")
        try:
            yield (
                router,
                generation_pb2_grpc.GenerationStub(channel),
                {"decode-a": decode_a, "decode-b": decode_b},
            )
        finally:
            channel.close()
            router.stop()


def request_of(variant: int, session: str, **sampling) -> generation_pb2.GenerateRequest:
    prompt = [(variant * 13 + 7 * i) % 91 + 2 for i in range(30)]
    return generation_pb2.GenerateRequest(
        token_ids=generation_pb2.TokenIds(ids=prompt),
        sampling=generation_pb2.SamplingParameters(max_tokens=MAX_TOKENS, ignore_eos=True, **sampling),
        session_id=session,
    )


def bits(values) -> list[int]:
    return np.asarray(values, dtype=np.float32).view(np.int32).tolist()


def logprobs(messages) -> list[float]:
    return [p for m in messages for p in m.logprobs]


def top_logprobs(messages) -> list[list[tuple[int, float]]]:
    return [[(t.token_id, t.logprob) for t in top.top] for m in messages for top in m.top_logprobs]


def metric(router: RouterServer, name: str, **labels) -> float:
    text = urlopen(f"http://127.0.0.1:{router.metrics_port}/metrics").read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


def test_streams_move_to_the_other_decode_worker_when_theirs_is_killed(cluster):
    router, stub, decode = cluster
    greedy = request_of(1, "s", temperature=0)
    seeded = request_of(2, "s", temperature=1.0, seed=99, logprobs=2)
    undisturbed = {name: list(stub.Generate(r, timeout=120)) for name, r in (("g", greedy), ("s", seeded))}

    # Both requests of one session go to its home decode worker; read a few tokens, then kill it.
    streams = {"g": stub.Generate(greedy, timeout=120), "s": stub.Generate(seeded, timeout=120)}
    got = {name: [next(stream), next(stream)] for name, stream in streams.items()}
    victim = next(
        name
        for name, process in decode.items()
        if workers_pb2_grpc.DecodeWorkerStub(grpc.insecure_channel(process.address))
        .Stats(workers_pb2.StatsRequest(), timeout=10)
        .running
        == 2
    )
    decode[victim].worker.process.kill()
    for name, stream in streams.items():
        got[name] += list(stream)

    survivor = next(name for name in decode if name != victim)
    for name in ("g", "s"):
        tokens = [t for m in got[name] for t in m.token_ids]
        assert tokens == [t for m in undisturbed[name] for t in m.token_ids]
        final = got[name][-1]
        assert final.route.decode_worker == survivor and final.route.transfer_backend == "nixl"
        assert final.usage.completion_tokens == MAX_TOKENS and final.usage.prompt_tokens == 30
    assert bits([p for m in got["s"] for p in m.logprobs]) == bits(
        [p for m in undisturbed["s"] for p in m.logprobs]
    )
    tops = [[(t.token_id, t.logprob) for t in top.top] for m in got["s"] for top in m.top_logprobs]
    assert tops == [
        [(t.token_id, t.logprob) for t in top.top] for m in undisturbed["s"] for top in m.top_logprobs
    ]
    assert metric(router, "baton_migrations_total", outcome="migrated") == 2  # the kill was mid-stream
    assert metric(router, "baton_requests_total", status="length") == 4
    survivor_stub = workers_pb2_grpc.DecodeWorkerStub(grpc.insecure_channel(decode[survivor].address))
    deadline = time.monotonic() + 10
    while (integrity := survivor_stub.CheckIntegrity(workers_pb2.IntegrityRequest(), timeout=10)).running:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert integrity.ok and integrity.used_blocks == 0 and integrity.used_slots == 0, integrity
