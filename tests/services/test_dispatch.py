"""The router's dispatch over real worker processes: conditional disaggregation, colocated serving, a
failed handoff re-prefilled elsewhere or locally, a decode worker killed mid-request (and the request
not migrated, as it asked)."""

import time
from typing import NamedTuple
from urllib.request import urlopen

import grpc
import pytest

from proto.baton.v1 import generation_pb2, workers_pb2, workers_pb2_grpc
from services.engine import LLM, SamplingParams
from tests.services.routers import router_factory
from tests.services.workers import WorkerProcess, running_workers


class Workers(NamedTuple):
    model: object
    decode: list[WorkerProcess]
    good_prefill: WorkerProcess
    failing_prefill: WorkerProcess  # every handoff fails (--fail-transfers)
    offline: LLM


@pytest.fixture(scope="module")
def workers(tiny_checkpoint):
    model = tiny_checkpoint("k3")
    flags = ("--dtype", "float32")
    specs = (("decode", *flags), ("decode", *flags), ("prefill", *flags))
    failing = ("prefill", *flags, "--fail-transfers", "1000")
    with running_workers(model, *specs, failing) as started:
        yield Workers(model, started[:2], started[2], started[3], LLM(str(model), dtype="float32"))


@pytest.fixture
def router_over(workers):
    with router_factory(workers.model) as make:
        yield make


def generate(stub, prompt, max_tokens, **fields):
    sampling = generation_pb2.SamplingParameters(max_tokens=max_tokens, ignore_eos=True)
    request = generation_pb2.GenerateRequest(token_ids=generation_pb2.TokenIds(ids=prompt), sampling=sampling)
    for name, value in fields.items():
        setattr(request, name, value)
    messages = list(stub.Generate(request, timeout=120))
    return [t for m in messages for t in m.token_ids], messages[-1]


def offline(workers, prompt, max_tokens):
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return workers.offline.generate([prompt], params)[0].token_ids


def prompt_of(length: int, seed: int) -> list[int]:
    return [(seed * 31 + 7 * i) % 97 + 1 for i in range(length)]


def test_a_short_prompt_is_prefilled_by_the_decode_worker(workers, router_over):
    router = router_over([workers.good_prefill], workers.decode[:1], local_prefill_tokens=16)
    short, long = prompt_of(12, 1), prompt_of(40, 2)
    tokens, final = generate(router.stub, short, 6)
    assert tokens == offline(workers, short, 6)
    assert final.route.prefill_worker == "" and final.route.transfer_backend == ""
    assert final.route.transfer_bytes == 0 and final.route.decode_worker == "decode-test"
    assert router.metric("baton_local_prefills_total", reason="short_prompt") == 1
    tokens, final = generate(router.stub, long, 6)
    assert tokens == offline(workers, long, 6)
    assert final.route.transfer_backend == "nixl"
    assert final.route.prefill_worker == workers.good_prefill.address


def test_the_next_turn_of_a_session_hits_the_decode_cache_and_stays_there(workers, router_over):
    router = router_over([workers.good_prefill], workers.decode[:1], local_prefill_tokens=0)
    first_turn = prompt_of(40, 3)
    reply, final = generate(router.stub, first_turn, 30)
    assert final.route.transfer_backend == "nixl"  # 40 uncached tokens: handed off
    # The next turn: the whole conversation so far plus a short new message. Decode computed every
    # token after the prompt itself, so its cache holds them (with KDA snapshots).
    next_turn = first_turn + reply[:29] + [5, 6, 7]
    tokens, final = generate(router.stub, next_turn, 5)
    assert tokens == offline(workers, next_turn, 5)
    assert final.route.prefill_worker == "" and final.usage.cached_tokens >= 48
    assert router.metric("baton_local_prefills_total", reason="cache_hit") == 1


def test_colocated_serving_never_hands_off(workers, router_over):
    router = router_over([], workers.decode[:1], disaggregation="never")
    prompt = prompt_of(50, 4)
    tokens, final = generate(router.stub, prompt, 5)
    assert tokens == offline(workers, prompt, 5)
    assert final.route.prefill_worker == "" and final.route.transfer_bytes == 0
    assert router.metric("baton_local_prefills_total", reason="colocated") == 1


def test_a_failed_handoff_is_prefilled_again_on_another_prefill_worker(workers, router_over):
    router = router_over(
        [workers.failing_prefill, workers.good_prefill], workers.decode[:1], disaggregation="always"
    )
    for seed in (5, 6, 7):  # cold prefix index: equal scores rotate, so the failing one comes first
        prompt = prompt_of(36, seed)
        tokens, final = generate(router.stub, prompt, 4)
        assert tokens == offline(workers, prompt, 4)
        assert final.route.prefill_worker == workers.good_prefill.address
        assert final.route.transfer_backend == "nixl" and final.route.transfer_bytes > 0
    assert router.metric("baton_handoff_fallbacks_total", target="prefill") >= 1
    assert router.metric("baton_handoff_fallbacks_total", target="decode") == 0
    stats = decode_stub(workers.decode[0]).Stats(workers_pb2.StatsRequest(), timeout=10)
    assert stats.running == 0 and stats.free_blocks == stats.total_blocks


def test_a_failed_handoff_with_no_other_prefill_worker_is_prefilled_on_decode(workers, router_over):
    router = router_over([workers.failing_prefill], workers.decode[:1], disaggregation="always")
    prompt = prompt_of(44, 8)
    tokens, final = generate(router.stub, prompt, 5)
    assert tokens == offline(workers, prompt, 5)
    assert final.route.prefill_worker == "" and final.route.transfer_bytes == 0
    assert router.metric("baton_handoff_fallbacks_total", target="decode") == 1
    failures = urlopen(f"http://127.0.0.1:{metrics_port(workers.failing_prefill)}/metrics").read().decode()
    assert 'baton_transfer_failures_total{backend="nixl"}' in failures


def test_prefill_goes_where_the_prefix_is_cached(workers, router_over):
    shared = prompt_of(64, 9)
    warm = router_over([workers.good_prefill], workers.decode[:1], disaggregation="always")
    _, final = generate(warm.stub, shared + [1, 2, 3, 4], 2)
    assert final.usage.cached_tokens == 0
    # A fresh router learns what the good worker's cache holds from its load feed's full picture (the
    # failing worker holds nothing of it); rotation alone would try the failing worker first for the
    # 1st and 3rd request.
    router = router_over(
        [workers.failing_prefill, workers.good_prefill], workers.decode[:1], disaggregation="always"
    )
    for suffix in ([5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]):
        _, final = generate(router.stub, shared + suffix, 2)
        assert final.route.prefill_worker == workers.good_prefill.address
        assert final.usage.cached_tokens == 64  # the prefill worker's own cache
    assert router.metric("baton_handoff_fallbacks_total", target="prefill") == 0


def test_a_client_without_a_deadline_is_served(workers, router_over):
    router = router_over([workers.good_prefill], workers.decode[:1], disaggregation="always")
    prompt = prompt_of(30, 12)
    request = generation_pb2.GenerateRequest(
        token_ids=generation_pb2.TokenIds(ids=prompt),
        sampling=generation_pb2.SamplingParameters(max_tokens=3, ignore_eos=True),
    )
    tokens = [t for m in router.stub.Generate(request) for t in m.token_ids]  # no timeout at all
    assert tokens == offline(workers, prompt, 3)


def test_many_concurrent_streams_all_run_at_once(workers, router_over):
    router = router_over([workers.good_prefill], workers.decode[:1], disaggregation="always")
    sampling = generation_pb2.SamplingParameters(max_tokens=400, ignore_eos=True)
    streams = [
        router.stub.Generate(
            generation_pb2.GenerateRequest(
                token_ids=generation_pb2.TokenIds(ids=prompt_of(20, 100 + i)), sampling=sampling
            ),
            timeout=120,
        )
        for i in range(24)  # more than a fixed pool of 16 handler threads could hold
    ]
    try:
        for stream in streams:
            next(stream)  # every request has its first token: all are decoding together
        stats = decode_stub(workers.decode[0]).Stats(workers_pb2.StatsRequest(), timeout=10)
        assert stats.running == 24
    finally:
        for stream in streams:
            stream.cancel()
    deadline = time.monotonic() + 10
    while decode_stub(workers.decode[0]).Stats(workers_pb2.StatsRequest(), timeout=10).running:
        assert time.monotonic() < deadline, "cancelled streams were not freed"
        time.sleep(0.1)


def test_a_decode_worker_killed_mid_request_fails_fast_without_migration_and_is_marked_down(
    workers, router_over
):
    router = router_over([workers.good_prefill], workers.decode, disaggregation="always")
    sampling = generation_pb2.SamplingParameters(max_tokens=2000, ignore_eos=True)
    request = generation_pb2.GenerateRequest(
        token_ids=generation_pb2.TokenIds(ids=prompt_of(30, 10)), sampling=sampling, no_migration=True
    )
    stream = router.stub.Generate(request, timeout=120)
    next(stream)  # decoding has started somewhere
    victim = next(d for d in workers.decode if decode_stub(d).Stats(workers_pb2.StatsRequest()).running)
    survivor = next(d for d in workers.decode if d is not victim)
    victim.worker.process.kill()
    killed_at = time.monotonic()
    with pytest.raises(grpc.RpcError) as failure:
        for _ in stream:
            pass
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - killed_at < 5
    assert "decode worker" in failure.value.details()
    assert router.metric("baton_worker_up", role="decode", worker=victim.address) == 0
    prompt = prompt_of(30, 11)
    tokens, final = generate(router.stub, prompt, 4)
    assert tokens == offline(workers, prompt, 4)
    assert final.route.decode_worker == "decode-test" and survivor.worker.alive()
    assert router.metric("baton_requests_total", status="unavailable") == 1
    assert router.metric("baton_migrations_total", outcome="opted_out") == 1


def decode_stub(process: WorkerProcess) -> workers_pb2_grpc.DecodeWorkerStub:
    return workers_pb2_grpc.DecodeWorkerStub(grpc.insecure_channel(process.address))


def metrics_port(process: WorkerProcess) -> int:
    ready = next(line for line in process.worker.output if line.startswith("READY "))
    return int(ready.split("metrics_port=")[1].split()[0])
