"""The router routes from its workers' pushed load feeds (``WatchLoad``), over real worker processes: no
``Stats`` call on the request path, the pool's view follows a worker's load, prefix scores follow the
worker's real cache (inserted, then evicted), and a killed worker is marked down by its broken feed."""

import time
from typing import NamedTuple

import grpc
import pytest

import router.worker_pool
from proto.baton.v1 import generation_pb2, workers_pb2, workers_pb2_grpc
from router.prefix_index import PromptHashes
from tests.lifecycle.cluster import wait_until
from tests.services.routers import router_factory
from tests.services.workers import WorkerProcess, running_workers

FLAGS = ("--dtype", "float32")
# Two sequences of 64 tokens: 8 blocks of 16, so a third 48-token prompt evicts an older one's blocks.
TINY_POOL = ("--max-num-seqs", "2", "--max-model-len", "64")


class Workers(NamedTuple):
    model: object
    decode: WorkerProcess
    prefill: list[WorkerProcess]


@pytest.fixture(scope="module")
def workers(tiny_checkpoint):
    model = tiny_checkpoint("k3")
    specs = (("decode", *FLAGS), ("prefill", *FLAGS, *TINY_POOL), ("prefill", *FLAGS, *TINY_POOL))
    with running_workers(model, *specs) as started:
        yield Workers(model, started[0], started[1:])


class StatsCalls(grpc.UnaryUnaryClientInterceptor):
    """Counts the ``Stats`` calls made on the channels it wraps."""

    def __init__(self):
        self.count = 0

    def intercept_unary_unary(self, continuation, details, request):
        if details.method.endswith("/Stats"):
            self.count += 1
        return continuation(details, request)


@pytest.fixture
def router_over(workers, monkeypatch):
    """``router_over(prefill, decode, **options) -> (RouterServer, stub, StatsCalls)``; the pool's
    channels count the ``Stats`` calls the router makes."""
    calls, plain = StatsCalls(), grpc.insecure_channel
    monkeypatch.setattr(
        router.worker_pool.grpc,
        "insecure_channel",
        lambda address, **options: grpc.intercept_channel(plain(address, **options), calls),
    )
    with router_factory(workers.model) as make:
        yield lambda prefill, decode, **options: (*make(prefill, decode, **options), calls)


def generate(stub, prompt: list[int], max_tokens: int = 1) -> generation_pb2.GenerateResponse:
    sampling = generation_pb2.SamplingParameters(max_tokens=max_tokens, ignore_eos=True)
    request = generation_pb2.GenerateRequest(token_ids=generation_pb2.TokenIds(ids=prompt), sampling=sampling)
    return list(stub.Generate(request, timeout=120))[-1]


def prompt_of(length: int, seed: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 200 + 1 for i in range(length)]


def test_the_request_path_makes_no_stats_call(workers, router_over):
    server, stub, calls = router_over(workers.prefill, [workers.decode], disaggregation="always")
    for seed in range(6):
        final = generate(stub, prompt_of(20, seed))
        assert final.route.prefill_worker in {p.address for p in workers.prefill}
    assert calls.count == 0, "the router asked a worker for Stats while routing"


def test_the_pools_view_follows_a_workers_load(workers, router_over):
    server, _, _ = router_over([], [workers.decode], disaggregation="never")
    worker = server.pool.decode[0]
    wait_until(lambda: worker.load is not None and worker.load.running == 0, 5, "the feed's first picture")
    channel = grpc.insecure_channel(workers.decode.address)
    local = workers_pb2.LocalPrefill(
        prompt_ids=prompt_of(20, 99),
        sampling=generation_pb2.SamplingParameters(max_tokens=3000, ignore_eos=True),
    )
    # Straight to the worker, so only its feed can tell the router.
    stream = workers_pb2_grpc.DecodeWorkerStub(channel).Decode(
        workers_pb2.DecodeRequest(request_id="direct-1", local_prefill=local), timeout=120
    )
    try:
        next(stream)
        started = time.monotonic()
        wait_until(lambda: worker.load.running == 1, 2, "the router's view of a running request")
        print(f"view followed the worker in {1000 * (time.monotonic() - started):.0f} ms")
    finally:
        stream.cancel()
        channel.close()
    wait_until(lambda: worker.load.running == 0, 2, "the router's view of the request's end")


def test_prefix_routing_follows_the_workers_real_cache_and_its_evictions(workers, router_over):
    server, stub, calls = router_over(workers.prefill, [workers.decode], disaggregation="always")
    pool, shared = server.pool, prompt_of(48, 1)
    first = generate(stub, shared).route.prefill_worker
    holder = next(w for w in pool.prefill if w.address == first)
    other = next(w for w in pool.prefill if w is not holder)
    prompt = PromptHashes(shared, "")
    wait_until(lambda: pool.prefix_tokens(holder, prompt) == 48, 2, "the holder's insert events")
    assert pool.prefix_tokens(other, prompt) == 0
    for seed in range(3):  # every prompt sharing the prefix goes where it is cached
        longer = shared + prompt_of(8, 50 + seed)
        # Once the holder's feed has reported its last request done (until then the router counts that
        # prompt as queued on it and, by design, may send the next one to the idle worker instead).
        wait_until(lambda: holder.load.queued_prompt_tokens == 0, 5, "the holder's feed after its prefill")
        assert generate(stub, longer).route.prefill_worker == holder.address
    # Fresh prompts (ties: rotated over both workers) fill the holder's tiny pool until it reuses the
    # shared prefix's blocks; the router hears of the eviction.
    for seed in range(10):
        generate(stub, prompt_of(48, 100 + seed))
        if pool.prefix_tokens(holder, prompt) < 48:
            break
    wait_until(lambda: pool.prefix_tokens(holder, prompt) < 48, 2, "the holder's evict events")
    assert calls.count == 0


def test_a_killed_worker_is_marked_down_by_its_broken_feed(workers, router_over):
    victim = WorkerProcess("decode", workers.model, *FLAGS)
    try:
        server, _, calls = router_over([], [workers.decode, victim], disaggregation="never")
        watched = next(w for w in server.pool.decode if w.address == victim.address)
        wait_until(lambda: watched.load is not None, 5, "the victim's first picture")
        victim.worker.process.kill()
        killed_at = time.monotonic()
        wait_until(lambda: not watched.up, 3, "the victim marked down")
        print(f"marked down {1000 * (time.monotonic() - killed_at):.0f} ms after the kill")
        assert [w.address for w in server.pool.decode_order("", 1.0)] == [workers.decode.address]
        assert calls.count == 0
    finally:
        victim.stop()
