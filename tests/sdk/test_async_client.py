"""``AsyncClient`` over ``grpc.aio`` against the scripted server (each test drives its own loop
with ``asyncio.run``): the same chunks, completion, errors, retry rule and cancellation."""

import asyncio

import grpc
import pytest

from sdk import AsyncClient, InvalidArgument, InvalidRequest, ModelInfo, NotFound, Unavailable
from tests.sdk.conftest import FAST_RETRY
from tests.sdk.scripted_server import STORY, fail, story, stream_then_fail


def run(server, body):
    """Run ``body(client)`` in a fresh event loop with a client created inside it."""

    async def main():
        async with AsyncClient(server.address, timeout_s=10, retry=FAST_RETRY) as client:
            return await body(client)

    return asyncio.run(main())


def test_stream_and_completion(server):
    async def body(client):
        chunks = [chunk async for chunk in client.generate_stream(prompt_ids=[1], logprobs=0)]
        return chunks, await client.generate(prompt_ids=[1], logprobs=0)

    chunks, completion = run(server, body)
    assert [c.token_ids for c in chunks] == [(11, 12), (13,), (14, 15)]
    assert chunks[-1].finish_reason == "length" and chunks[0].usage is None
    assert completion.token_ids == (11, 12, 13, 14, 15) and completion.text == "Hello you"
    assert completion.logprobs == (-0.5, -0.25, -0.125, -1.0, -2.0) and completion.top_logprobs is None
    assert completion.usage.prompt_tokens == 3 and completion.route.transfer_bytes == 4096


def test_generate_is_retried_before_the_first_message(server):
    server.script.generate = fail(grpc.StatusCode.UNAVAILABLE, "restarting", times=2, then=story)
    completion = run(server, lambda client: client.generate(prompt_ids=[1]))
    assert completion.finish_reason == "length"
    assert server.script.calls["Generate"] == 3


def test_generate_is_not_retried_after_a_message(server):
    server.script.generate = stream_then_fail(STORY[:1], grpc.StatusCode.UNAVAILABLE, "worker died")

    async def body(client):
        received = []
        with pytest.raises(Unavailable, match="worker died"):
            async for chunk in client.generate_stream(prompt_ids=[1]):
                received.append(chunk.token_ids)
        return received

    assert run(server, body) == [(11, 12)]
    assert server.script.calls["Generate"] == 1


def test_errors_are_typed_and_invalid_argument_is_not_retried(server):
    server.script.generate = fail(grpc.StatusCode.INVALID_ARGUMENT, "temperature: must be >= 0")
    server.script.tokenize = fail(grpc.StatusCode.NOT_FOUND, "model: 'x' is not served here")

    async def body(client):
        with pytest.raises(InvalidArgument) as invalid:
            await client.generate("hi", temperature=-1.0)
        with pytest.raises(NotFound) as missing:
            await client.tokenize("hi", model="x")
        with pytest.raises(InvalidRequest):
            client.generate_stream(prompt="a", messages=[])  # raised at the call, not on iteration
        return invalid.value, missing.value

    invalid, missing = run(server, body)
    assert invalid.details == "temperature: must be >= 0" and missing.code == grpc.StatusCode.NOT_FOUND
    assert server.script.calls["Generate"] == 1


def test_unary_calls_are_retried(server):
    server.script.list_models = fail(
        grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", times=2, then=server.script.list_models
    )

    async def body(client):
        return await client.list_models(), await client.tokenize("hi")

    models, ids = run(server, body)
    assert models == [ModelInfo(id="k3-tiny", family="k3", max_model_len=4096)] and ids == [1, 2, 3]
    assert server.script.calls["ListModels"] == 3


def test_closing_a_stream_early_cancels_the_call_on_the_server(server):
    server.script.generate = server.script.stream_then_wait(STORY[:1])

    async def body(client):
        cancelled = server.script.cancelled
        stream = client.generate_stream(prompt_ids=[1])
        first = await stream.__anext__()
        early = await asyncio.to_thread(cancelled.wait, 0.2)  # still running while the caller holds it
        await stream.aclose()
        # observed before the client (and its channel) closes, so aclose() is what cancelled it
        return first, early, await asyncio.to_thread(cancelled.wait, 5)

    first, early, cancelled = run(server, body)
    assert first.token_ids == (11, 12) and not early and cancelled
