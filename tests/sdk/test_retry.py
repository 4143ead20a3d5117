"""The retry rule: Generate is retried on UNAVAILABLE / RESOURCE_EXHAUSTED only before its first
message; unary calls on those codes; nothing else; never a wait past the call's deadline."""

import time

import grpc
import pytest

from proto.baton.v1 import generation_pb2
from sdk import Client, InvalidArgument, ResourceExhausted, RetryPolicy, Unavailable
from sdk.retry import Attempts
from tests.sdk.conftest import FAST_RETRY
from tests.sdk.scripted_server import STORY, chunk, fail, story, stream_then_fail

RETRIED = [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED]


@pytest.mark.parametrize("code", RETRIED, ids=lambda code: code.name)
def test_generate_is_retried_before_the_first_message(server, code):
    server.script.generate = fail(code, "not now", times=2, then=story)
    with Client(server.address, retry=FAST_RETRY, timeout_s=10) as client:
        completion = client.generate(prompt_ids=[1, 2, 3], seed=5)
    assert server.script.calls["Generate"] == 3
    assert completion.token_ids == (11, 12, 13, 14, 15)
    first, *retries = server.script.requests["Generate"]
    assert all(retry == first for retry in retries)  # the same request each time


def test_generate_is_not_retried_after_a_message_arrived(server):
    server.script.generate = stream_then_fail(
        STORY[:2], grpc.StatusCode.UNAVAILABLE, "decode worker d:2 died"
    )
    with Client(server.address, retry=FAST_RETRY, timeout_s=10) as client:
        received = []
        with pytest.raises(Unavailable, match="decode worker d:2 died"):
            for piece in client.generate_stream(prompt_ids=[1]):
                received.append(piece.token_ids)
        assert received == [(11, 12), (13,)]
        assert server.script.calls["Generate"] == 1
        with pytest.raises(Unavailable):
            client.generate(prompt_ids=[1])
    assert server.script.calls["Generate"] == 2  # one more call, still not retried


def test_an_empty_first_message_counts_as_received(server):
    server.script.generate = stream_then_fail([chunk([])], grpc.StatusCode.RESOURCE_EXHAUSTED, "full")
    with Client(server.address, retry=FAST_RETRY, timeout_s=10) as client, pytest.raises(ResourceExhausted):
        client.generate(prompt_ids=[1])
    assert server.script.calls["Generate"] == 1


def test_invalid_argument_is_never_retried(server):
    server.script.generate = fail(
        grpc.StatusCode.INVALID_ARGUMENT, "max_tokens: too many", times=1, then=story
    )
    with Client(server.address, retry=FAST_RETRY, timeout_s=10) as client:
        with pytest.raises(InvalidArgument, match="max_tokens: too many"):
            client.generate(prompt_ids=[1])
    assert server.script.calls["Generate"] == 1


def test_retries_stop_after_max_attempts(server):
    server.script.generate = fail(grpc.StatusCode.UNAVAILABLE, "down")
    with Client(server.address, retry=FAST_RETRY, timeout_s=10) as client, pytest.raises(Unavailable):
        client.generate(prompt_ids=[1])
    assert server.script.calls["Generate"] == FAST_RETRY.max_attempts


def test_a_backoff_longer_than_the_deadline_is_not_slept(server):
    server.script.generate = fail(grpc.StatusCode.UNAVAILABLE, "down", times=1, then=story)
    slow = RetryPolicy(max_attempts=5, initial_backoff_s=5.0, jitter=0.0)
    started = time.monotonic()
    with Client(server.address, retry=slow, timeout_s=1.0) as client, pytest.raises(Unavailable):
        client.generate(prompt_ids=[1])
    assert time.monotonic() - started < 0.9
    assert server.script.calls["Generate"] == 1


def test_retries_end_before_the_deadline(server):
    server.script.generate = fail(grpc.StatusCode.UNAVAILABLE, "down")
    steady = RetryPolicy(max_attempts=100, initial_backoff_s=0.25, multiplier=1.0, jitter=0.0)
    started = time.monotonic()
    with Client(server.address, retry=steady, timeout_s=1.0) as client, pytest.raises(Unavailable):
        client.generate(prompt_ids=[1])
    elapsed = time.monotonic() - started
    assert 0.5 <= elapsed < 1.0  # waited between attempts, but never past the deadline
    assert 2 <= server.script.calls["Generate"] <= 4


@pytest.mark.parametrize("code", RETRIED, ids=lambda code: code.name)
def test_unary_calls_are_retried(server, code):
    server.script.tokenize = fail(code, "busy", times=2, then=lambda *_: _tokens([7, 8]))
    server.script.list_models = fail(code, "busy", times=1, then=lambda *_: _models())
    with Client(server.address, retry=FAST_RETRY, timeout_s=10) as client:
        assert client.tokenize("hi") == [7, 8]
        assert [model.id for model in client.list_models()] == ["m"]
    assert server.script.calls["Tokenize"] == 3 and server.script.calls["ListModels"] == 2


def test_unary_invalid_argument_is_not_retried(server):
    server.script.tokenize = fail(grpc.StatusCode.INVALID_ARGUMENT, "text: no tokenizer")
    with Client(server.address, retry=FAST_RETRY, timeout_s=10) as client, pytest.raises(InvalidArgument):
        client.tokenize("hi")
    assert server.script.calls["Tokenize"] == 1


def test_backoff_grows_is_capped_and_jitter_only_shortens():
    policy = RetryPolicy(initial_backoff_s=0.1, max_backoff_s=0.3, multiplier=2.0, jitter=0.5)
    assert [policy.backoff_s(k, 0.0) for k in (1, 2, 3, 4)] == pytest.approx([0.1, 0.2, 0.3, 0.3])
    assert policy.backoff_s(2, 0.999) == pytest.approx(0.2 * (1 - 0.5 * 0.999))


def test_attempts_respect_the_deadline_on_a_fake_clock():
    now = [100.0]
    attempts = Attempts(
        RetryPolicy(max_attempts=10, initial_backoff_s=1.0, multiplier=2.0, max_backoff_s=60, jitter=0.0),
        timeout_s=5.0,
        clock=lambda: now[0],
        rng=lambda: 0.0,
    )
    error = Unavailable("down")
    assert attempts.start() == 5.0
    assert attempts.retry_delay_s(error, received=False) == 1.0  # ends at 101 < 105
    now[0] = 101.0
    assert attempts.start() == 4.0
    assert attempts.retry_delay_s(error, received=True) is None  # a streamed message was received
    assert attempts.retry_delay_s(InvalidArgument("x"), received=False) is None
    assert attempts.retry_delay_s(error, received=False) == 2.0  # ends at 103 < 105
    now[0] = 103.0
    attempts.start()
    assert attempts.retry_delay_s(error, received=False) is None  # 4 s would end at 107 > 105


def test_policy_rejects_nonsense():
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="jitter"):
        RetryPolicy(jitter=2.0)


def _tokens(ids):
    return generation_pb2.TokenizeResponse(token_ids=ids)


def _models():
    return generation_pb2.ListModelsResponse(models=[generation_pb2.ModelInfo(id="m")])
