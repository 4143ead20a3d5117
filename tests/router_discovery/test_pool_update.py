"""A router over a real decode worker whose membership changes under it: no decode worker is
UNAVAILABLE, a worker that joins serves, a worker that leaves finishes the request it is running and
takes no new ones, and its ``baton_worker_up`` sample goes with it."""

from urllib.request import urlopen

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proto.baton.v1 import generation_pb2, generation_pb2_grpc, workers_pb2, workers_pb2_grpc
from router.discovery import Discovery
from router.server import RouterConfig, RouterServer

LONG_TOKENS = 1500


class ManualDiscovery(Discovery):
    """The test decides the workers: ``set(prefill, decode)``."""

    def __init__(self):
        self.on_change = None

    def start(self, on_change) -> None:
        self.on_change = on_change
        on_change([], [])

    def stop(self) -> None:
        self.on_change = None

    def set(self, prefill: list[str], decode: list[str]) -> None:
        self.on_change(prefill, decode)


def generate(stub, prompt: list[int], max_tokens: int = 3, timeout_s: float = 60):
    request = generation_pb2.GenerateRequest(
        token_ids=generation_pb2.TokenIds(ids=prompt),
        sampling=generation_pb2.SamplingParameters(max_tokens=max_tokens, ignore_eos=True),
    )
    return stub.Generate(request, timeout=timeout_s)


def worker_up_samples(metrics_port: int) -> dict[tuple[str, str], float]:
    text = urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read().decode()
    return {
        (sample.labels["role"], sample.labels["worker"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "baton_worker_up"
    }


def assert_unavailable(stub) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        list(generate(stub, [5, 6, 7]))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "no decode worker" in caught.value.details()


def test_decode_workers_join_and_leave_under_running_requests(decode_worker):
    model, worker = decode_worker
    discovery = ManualDiscovery()
    router = RouterServer(RouterConfig(model=str(model), port=0, disaggregation="never"), discovery=discovery)
    channel = grpc.insecure_channel(f"127.0.0.1:{router.port}")
    worker_channel = grpc.insecure_channel(worker.address)
    stub = generation_pb2_grpc.GenerationStub(channel)
    worker_stub = workers_pb2_grpc.DecodeWorkerStub(worker_channel)
    try:
        assert_unavailable(stub)  # nothing discovered yet: an error, not a crash
        assert worker_up_samples(router.metrics_port) == {}

        discovery.set([], [worker.address])
        final = list(generate(stub, [5, 6, 7]))[-1]
        assert final.finish_reason == generation_pb2.FINISH_REASON_LENGTH
        assert worker_up_samples(router.metrics_port) == {("decode", worker.address): 1.0}

        long = generate(stub, [1, 2, 3], max_tokens=LONG_TOKENS, timeout_s=300)
        received = len(next(long).token_ids)
        discovery.set([], [])  # the worker leaves while it streams
        assert worker_stub.Stats(workers_pb2.StatsRequest(), timeout=10).running == 1, "still in flight"
        assert_unavailable(stub)
        assert worker_up_samples(router.metrics_port) == {}
        messages = list(long)
        received += sum(len(m.token_ids) for m in messages)
        assert messages[-1].finish_reason == generation_pb2.FINISH_REASON_LENGTH
        assert received == LONG_TOKENS, "the request on the removed worker ran to its end"

        discovery.set([], [worker.address])  # back again: a fresh connection
        assert list(generate(stub, [8, 9]))[-1].finish_reason == generation_pb2.FINISH_REASON_LENGTH
    finally:
        worker_channel.close()
        channel.close()
        router.stop()
