"""One cluster for the fuzz tests: real prefill and decode workers, a router with its OpenAI front.

Every generation stops at ``FUZZ_MAX_MODEL_LEN`` tokens (workers and router alike), so a fuzzed
``max_tokens`` costs little and prompts past it take the refusal paths.
"""

from typing import NamedTuple

import grpc
import pytest

from deploy.benchmark.fuzz_bench import FUZZ_MAX_MODEL_LEN
from deploy.benchmark.fuzz_client import FuzzClient
from proto.baton.v1 import generation_pb2_grpc
from router.server import RouterConfig, RouterServer
from tests.services.workers import running_workers


class Cluster(NamedTuple):
    router: RouterServer
    client: FuzzClient  # both surfaces, with the fuzz deadline
    stub: generation_pb2_grpc.GenerationStub
    channel: grpc.Channel  # for raw calls (bytes in, bytes out)
    workers: list  # WorkerProcess, to check they are still alive


@pytest.fixture(scope="package")
def cluster(tiny_checkpoint):
    model = tiny_checkpoint("kimi_linear")
    flags = ("--dtype", "float32", "--max-model-len", str(FUZZ_MAX_MODEL_LEN))
    with running_workers(model, ("decode", *flags), ("prefill", *flags)) as workers:
        decode, prefill = workers
        router = RouterServer(
            RouterConfig(
                model=str(model),
                prefill=(prefill.address,),
                decode=(decode.address,),
                port=0,
                http_port=0,
                max_model_len=FUZZ_MAX_MODEL_LEN,
            )
        )
        client = FuzzClient(f"127.0.0.1:{router.port}", f"127.0.0.1:{router.http_port}", deadline_s=30.0)
        channel = grpc.insecure_channel(f"127.0.0.1:{router.port}")
        try:
            yield Cluster(router, client, generation_pb2_grpc.GenerationStub(channel), channel, workers)
        finally:
            channel.close()
            client.close()
            router.stop()
