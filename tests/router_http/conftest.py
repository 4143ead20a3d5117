"""One cluster for the HTTP tests: real decode and prefill workers, a router with its OpenAI front."""

import time
from typing import NamedTuple

import grpc
import pytest

from proto.baton.v1 import generation_pb2_grpc, workers_pb2, workers_pb2_grpc
from router.server import RouterConfig, RouterServer
from tests.services.workers import running_workers


class Cluster(NamedTuple):
    model: object  # the checkpoint folder
    router: RouterServer
    port: int  # the OpenAI front
    stub: generation_pb2_grpc.GenerationStub  # the router's gRPC API, for comparisons
    decode: workers_pb2_grpc.DecodeWorkerStub
    prefill_address: str
    decode_address: str


@pytest.fixture(scope="package")
def cluster(tiny_checkpoint):
    """Shared by every file here: workers take seconds to start, and each test leaves them idle."""
    model = tiny_checkpoint("kimi_linear")
    flags = ("--dtype", "float32")
    with running_workers(model, ("decode", *flags), ("prefill", *flags)) as (decode, prefill):
        router = RouterServer(
            RouterConfig(
                model=str(model), prefill=(prefill.address,), decode=(decode.address,), port=0, http_port=0
            )
        )
        channel = grpc.insecure_channel(f"127.0.0.1:{router.port}")
        decode_channel = grpc.insecure_channel(decode.address)
        yield Cluster(
            model,
            router,
            router.http_port,
            generation_pb2_grpc.GenerationStub(channel),
            workers_pb2_grpc.DecodeWorkerStub(decode_channel),
            prefill.address,
            decode.address,
        )
        decode_channel.close()
        channel.close()
        router.stop()


def decode_running(stub: workers_pb2_grpc.DecodeWorkerStub) -> int:
    return stub.Stats(workers_pb2.StatsRequest(), timeout=10).running


def decode_idle(stub: workers_pb2_grpc.DecodeWorkerStub, timeout_s: float) -> bool:
    """True once the decode worker runs nothing and every block and slot is free again."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = stub.Stats(workers_pb2.StatsRequest(), timeout=10)
        if (
            stats.running == 0
            and stats.free_blocks == stats.total_blocks
            and stats.free_slots == stats.total_slots
        ):
            return True
        time.sleep(0.1)
    return False
