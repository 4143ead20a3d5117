"""The sync ``Client`` against the scripted server: chunks in order, the assembled ``Completion``,
requests as sent, deadlines, cancellation of an abandoned stream, tokenize and list_models."""

import time

import pytest

from sdk import Client, Completion, DeadlineExceeded, GenerationChunk, InvalidRequest, ModelInfo, Route, Usage
from tests.sdk.conftest import FAST_RETRY
from tests.sdk.scripted_server import STORY, final, pb, wait_past_deadline

USAGE = Usage(
    prompt_tokens=3,
    completion_tokens=5,
    cached_tokens=1,
    cached_tokens_host=1,
    draft_tokens=4,
    accepted_draft_tokens=3,
)
ROUTE = Route(prefill_worker="p:1", decode_worker="d:2", transfer_backend="nixl", transfer_bytes=4096)


def test_stream_yields_chunks_in_order_with_usage_and_route_only_last(server):
    with Client(server.address, timeout_s=10) as client:
        chunks = list(client.generate_stream(prompt_ids=[1, 2, 3], logprobs=2))
    assert [c.token_ids for c in chunks] == [(11, 12), (13,), (14, 15)]
    assert [c.text for c in chunks] == ["He", "llo", " you"]
    assert chunks[0].top_logprobs == (((11, -0.5), (7, -1.0)), ((12, -0.25), (8, -2.0)))
    assert [(c.finish_reason, c.usage, c.route) for c in chunks[:2]] == [(None, None, None)] * 2
    assert chunks[-1] == GenerationChunk(
        request_id="req-1",
        token_ids=(14, 15),
        logprobs=(-1.0, -2.0),
        top_logprobs=(),
        text=" you",
        finish_reason="length",
        usage=USAGE,
        route=ROUTE,
    )


def test_generate_assembles_the_completion(server):
    with Client(server.address, timeout_s=10) as client:
        completion = client.generate(prompt_ids=[1, 2, 3], logprobs=2)
    assert completion == Completion(
        request_id="req-1",
        token_ids=(11, 12, 13, 14, 15),
        logprobs=(-0.5, -0.25, -0.125, -1.0, -2.0),
        top_logprobs=(
            ((11, -0.5), (7, -1.0)),
            ((12, -0.25), (8, -2.0)),
            ((13, -0.125), (9, -3.0)),
        ),
        text="Hello you",
        finish_reason="length",
        usage=USAGE,
        route=ROUTE,
    )


@pytest.mark.parametrize("logprobs, want_logprobs, want_top", [(None, False, False), (0, True, False)])
def test_logprobs_are_none_unless_requested(server, logprobs, want_logprobs, want_top):
    with Client(server.address, timeout_s=10) as client:
        completion = client.generate("hi", logprobs=logprobs)
    assert (completion.logprobs is not None) == want_logprobs
    assert (completion.top_logprobs is not None) == want_top


@pytest.mark.parametrize(
    "reason, name",
    [(pb.FINISH_REASON_STOP, "stop"), (pb.FINISH_REASON_LENGTH, "length"), (pb.FINISH_REASON_ABORT, "abort")],
    ids=["stop", "length", "abort"],
)
def test_finish_reasons_are_named(server, reason, name):
    server.script.generate = lambda request, context, attempt: [final([4], "x", reason=reason)]
    with Client(server.address, timeout_s=10) as client:
        assert client.generate("hi").finish_reason == name


def test_the_request_arrives_as_given(server):
    with Client(server.address, timeout_s=10) as client:
        client.generate(
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=9,
            stop=["END"],
            seed=3,
            session_id="s",
            tenant="t",
            model="k3-tiny",
        )
    (request,) = server.script.requests["Generate"]
    assert request.WhichOneof("prompt") == "chat" and request.chat.messages[0].content == "hi"
    assert request.sampling.max_tokens == 9 and list(request.sampling.stop) == ["END"]
    assert request.sampling.seed == 3 and not request.sampling.HasField("logprobs")
    assert (request.session_id, request.tenant, request.model) == ("s", "t", "k3-tiny")


def test_a_bad_argument_raises_before_anything_is_sent(server):
    with Client(server.address, timeout_s=10) as client:
        with pytest.raises(InvalidRequest, match="prompt_ids"):
            client.generate_stream(prompt_ids=[-1])
        with pytest.raises(InvalidRequest, match="exactly one"):
            client.generate("a", prompt_ids=[1])
    assert server.script.calls["Generate"] == 0


def test_the_per_call_timeout_overrides_the_default(server):
    server.script.generate = wait_past_deadline
    with Client(server.address, timeout_s=30, retry=FAST_RETRY) as client:
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            client.generate(prompt_ids=[1], timeout_s=0.3)
        assert 0.25 < time.monotonic() - started < 5
    assert server.script.calls["Generate"] == 1  # DEADLINE_EXCEEDED is not retried


def test_the_default_timeout_is_the_deadline(server):
    server.script.generate = wait_past_deadline
    with Client(server.address, timeout_s=0.3) as client, pytest.raises(DeadlineExceeded):
        list(client.generate_stream(prompt_ids=[1]))


def test_closing_a_stream_early_cancels_the_call_on_the_server(server):
    server.script.generate = server.script.stream_then_wait(STORY[:1])
    with Client(server.address, timeout_s=30) as client:
        stream = client.generate_stream(prompt_ids=[1])
        assert next(stream).token_ids == (11, 12)
        assert not server.script.cancelled.wait(0.2)  # still running while the caller holds it
        stream.close()
        assert server.script.cancelled.wait(5)


def test_tokenize_and_list_models(server):
    with Client(server.address, timeout_s=10) as client:
        assert client.tokenize("hello") == [1, 2, 3]
        assert client.tokenize(messages=[{"role": "user", "content": "hi"}]) == [1, 2, 3]
        assert client.list_models() == [ModelInfo(id="k3-tiny", family="k3", max_model_len=4096)]
    text, chat = server.script.requests["Tokenize"]
    assert text.text == "hello" and chat.chat.messages[0].role == "user" and chat.chat.add_generation_prompt
