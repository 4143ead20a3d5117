"""End to end through the real processes, for every family: ``LocalCluster`` (what ``baton serve``
runs) in batch-invariant mode, asked over gRPC and over the OpenAI HTTP front, against the offline
engine. Greedy tokens are identical; logprobs are bitwise equal; the state went over NIXL."""

import grpc
import numpy as np
import pytest

from deploy.local.launcher import LocalCluster
from proto.baton.v1 import generation_pb2, generation_pb2_grpc
from services.engine import LLM, SamplingParams
from tests.conftest import FAMILIES
from tests.router_http.client import post

MAX_TOKENS = 8


@pytest.fixture(scope="module", params=FAMILIES)
def served(request, tiny_checkpoint):
    model = tiny_checkpoint(request.param)
    cluster = LocalCluster(
        str(model),
        port=0,
        prefill_workers=1,
        decode_workers=1,
        worker_args=["--batch-invariant", "--dtype", "float32"],
        http_port=0,
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{cluster.port}")
    yield model, generation_pb2_grpc.GenerationStub(channel), cluster.router.http_port
    channel.close()
    cluster.stop()


def bits(values) -> list[int]:
    return np.asarray(values, dtype=np.float32).view(np.int32).tolist()


def test_grpc_http_and_offline_agree_token_for_token_and_bit_for_bit(served):
    model, stub, http_port = served
    prompt = [(11 * i + 5) % 90 + 3 for i in range(40)]  # over --local-prefill-tokens: handed off
    sampling = generation_pb2.SamplingParameters(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    request = generation_pb2.GenerateRequest(token_ids=generation_pb2.TokenIds(ids=prompt), sampling=sampling)
    messages = list(stub.Generate(request, timeout=120))
    grpc_tokens = [t for m in messages for t in m.token_ids]
    grpc_logprobs = [p for m in messages for p in m.logprobs]
    final = messages[-1]
    assert final.route.transfer_backend == "nixl" and final.route.transfer_bytes > 0

    # The same prompt again, over HTTP: now a prefix-cache hit on the prefill worker, which the
    # batch-invariant contract says changes nothing.
    reply = post(
        http_port,
        "/v1/completions",
        {
            "prompt": prompt,
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
            "logprobs": 0,
            "return_token_ids": True,
        },
        timeout=120,
    )
    assert reply.status == 200, reply.body
    choice = reply.body["choices"][0]
    assert reply.body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0

    want = LLM(str(model), dtype="float32", batch_invariant=True).generate(
        [prompt], SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, logprobs=0)
    )[0]
    assert grpc_tokens == want.token_ids == choice["token_ids"]
    assert bits(grpc_logprobs) == bits(want.logprobs) == bits(choice["logprobs"]["token_logprobs"])


def test_text_prompts_agree_over_grpc_and_http(served):
    _, stub, http_port = served
    text = "The relay team passed the baton cleanly at every exchange."
    sampling = generation_pb2.SamplingParameters(max_tokens=MAX_TOKENS, ignore_eos=True)
    messages = list(stub.Generate(generation_pb2.GenerateRequest(text=text, sampling=sampling), timeout=120))
    reply = post(
        http_port,
        "/v1/completions",
        {"prompt": text, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True},
        timeout=120,
    )
    assert reply.status == 200, reply.body
    assert reply.body["choices"][0]["text"] == "".join(m.text for m in messages)
    assert reply.body["usage"]["completion_tokens"] == MAX_TOKENS
