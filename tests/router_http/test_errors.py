"""Refusals and failures over a real cluster: 400s naming the field (the front's own checks and the
router's INVALID_ARGUMENT), 404/405/413, 429 from a full router queue, 504 from ``timeout``, a client
that disconnects mid-stream freeing the decode worker, and a front that keeps serving throughout."""

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from router.openai import OpenAIFront
from router.openai.app import MAX_BODY_BYTES
from router.server import RouterConfig, RouterServer
from tests.router_http.client import OpenStream, get, post, stream
from tests.router_http.conftest import decode_idle, decode_running

LONG = {"prompt": [1, 2], "max_tokens": 4000, "ignore_eos": True}
PART = {"type": "image_url", "image_url": {"url": "http://x"}}
USER = [{"role": "user", "content": "hi"}]

BAD_REQUESTS = [
    ("completions", b'{"prompt": "hi",', "body", "body: not valid JSON"),
    ("completions", b"[1, 2]", "body", "body: must be a JSON object"),
    ("completions", {"max_tokens": 3}, "prompt", "prompt: required"),
    (
        "completions",
        {"prompt": "hi", "max_tokens": 0},
        "max_tokens",
        "max_tokens: must be a positive integer",
    ),
    (
        "completions",
        {"prompt": "hi", "max_tokens": "x"},
        "max_tokens",
        "max_tokens: must be a positive integer",
    ),
    (
        "completions",
        {"prompt": "hi", "n": 17},
        "n",
        "n: must be an integer in [1, 16] (the router's --max-n)",
    ),
    ("completions", {"prompt": "hi", "n": 0}, "n", "n: must be an integer in [1, 16]"),
    ("chat", {"messages": USER, "n": 17}, "n", "n: must be an integer in [1, 16]"),
    (
        "completions",
        {"prompt": [1, 99999]},
        "prompt",
        "prompt: id 99999 at position 1 is outside the vocabulary",
    ),
    (
        "completions",
        {"prompt": ["a"] * 65},
        "prompt",
        "prompt: a batch of 65 prompts, more than the limit of 64",
    ),
    ("completions", {"prompt": ["a", [1, 2]]}, "prompt", "prompt: a batch is a list of texts or a list"),
    ("completions", {"prompt": [[1, 2], []]}, "prompt", "prompt: must not be empty"),
    ("completions", {"prompt": [[1, 2], [1, 99999]]}, "prompt", "prompt: id 99999 at position 1 is outside"),
    ("completions", {"prompt": [1, -2]}, "prompt", "prompt: must be a list of token ids"),
    ("completions", {"prompt": "hi", "temperature": -1}, "temperature", "temperature: must be a number"),
    ("completions", {"prompt": "hi", "top_p": 1.5}, "top_p", "top_p: must be a number in (0.0, 1.0]"),
    ("completions", {"prompt": "hi", "logprobs": 50}, "logprobs", "logprobs: must be an integer in [0, 20]"),
    ("completions", {"prompt": "hi", "stop": [""]}, "stop", "stop: must be a non-empty string"),
    (
        "completions",
        {"prompt": "hi", "echo": True, "logprobs": 21},
        "logprobs",
        "logprobs: must be an integer in [0, 20]",
    ),
    (
        "completions",
        {"prompt": "hi", "echo": True, "max_tokens": -1},
        "max_tokens",
        "max_tokens: must be a positive integer",
    ),
    (
        "completions",
        {"prompt": "hi", "echo": False, "max_tokens": 0, "logprobs": 1},
        "max_tokens",
        "max_tokens: must be a positive integer",
    ),
    ("completions", {"prompt": "hi", "echo": 1}, "echo", "echo: must be a boolean"),
    ("completions", {"prompt": "hi", "best_of": 3}, "best_of", "best_of: only best_of equal to n (1)"),
    (
        "completions",
        {"prompt": "hi", "n": 2, "best_of": 3},
        "best_of",
        "best_of: only best_of equal to n (2)",
    ),
    ("completions", {"prompt": "hi", "stream_options": {}}, "stream_options", "stream_options: only allowed"),
    ("completions", {"prompt": "hi", "timeout": -1}, "timeout", "timeout: must be a number"),
    ("completions", {"prompt": "hi", "model": "other"}, "model", "model: 'other' is not served here"),
    ("chat", {"max_tokens": 2}, "messages", "messages: required"),
    (
        "chat",
        {"messages": [{"role": "bot", "content": "x"}]},
        "messages[0].role",
        "messages[0].role: must be",
    ),
    (
        "chat",
        {"messages": USER * 2 + [{"role": "user", "content": [PART]}]},
        "messages[2].content[0].type",
        "messages[2].content[0].type: only 'text' parts are supported, got 'image_url'",
    ),
    (
        "chat",
        {"messages": USER, "tools": [{"type": "function"}]},
        "tools[0].function",
        "tools[0].function: must be an object",
    ),
    ("chat", {"messages": USER, "functions": [{"name": "f"}]}, "functions", "functions: the legacy"),
    ("chat", {"messages": USER, "top_logprobs": 2}, "top_logprobs", "top_logprobs: needs logprobs: true"),
    (
        "chat",
        {"messages": USER, "max_completion_tokens": 0},
        "max_completion_tokens",
        "max_completion_tokens:",
    ),
]


@pytest.mark.parametrize(
    "endpoint, body, param, words",
    BAD_REQUESTS,
    ids=[f"{e}-{p}-{i}" for i, (e, _, p, _) in enumerate(BAD_REQUESTS)],
)
def test_bad_requests_are_400_naming_the_field(cluster, endpoint, body, param, words):
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    reply = post(cluster.port, path, body)
    assert reply.status == 400, reply.body
    error = reply.body["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert error["message"].startswith(words), error["message"]
    if isinstance(body, dict) and param != "stream_options":  # streamed: refused before any event
        assert stream(cluster.port, path, body).status == 400


def test_unknown_routes_and_methods_get_openai_errors(cluster):
    assert get(cluster.port, "/v1/nothing").status == 404
    wrong_method = get(cluster.port, "/v1/completions")
    assert wrong_method.status == 405 and "error" in wrong_method.body


def test_an_oversized_body_is_413(cluster):
    padding = MAX_BODY_BYTES - len(b'{"prompt": ""}') + 1
    reply = post(cluster.port, "/v1/completions", b'{"prompt": "' + b"a" * padding + b'"}')
    assert reply.status == 413 and reply.body["error"]["param"] == "body"


def test_timeout_becomes_the_grpc_deadline(cluster):
    started = time.monotonic()
    reply = post(cluster.port, "/v1/completions", {**LONG, "timeout": 1.0})
    assert reply.status == 504 and reply.body["error"]["code"] == "deadline_exceeded"
    assert time.monotonic() - started < 10
    assert decode_idle(cluster.decode, timeout_s=3.0)


def test_client_disconnect_mid_stream_frees_the_decode_worker(cluster):
    open_stream = OpenStream(cluster.port, "/v1/completions", LONG)
    try:
        assert open_stream.status == 200
        events = [json.loads(open_stream.next_event()) for _ in range(3)]
        assert all(e["choices"][0]["finish_reason"] is None for e in events)
        assert decode_running(cluster.decode) == 1
    finally:
        open_stream.close()
    assert decode_idle(cluster.decode, timeout_s=3.0), "the decode worker still holds the abandoned request"


def test_a_full_router_queue_is_429_and_recovers(cluster):
    """A second router over the same workers with one seat and no queue: a streaming request holds
    the seat, so concurrent requests (streamed or not) are refused with 429 until it goes."""
    small = RouterServer(
        RouterConfig(
            model=str(cluster.model),
            prefill=(cluster.prefill_address,),
            decode=(cluster.decode_address,),
            port=0,
            http_port=0,
            max_running=1,
            max_queued=0,
        )
    )
    try:
        holder = OpenStream(small.http_port, "/v1/completions", LONG)
        try:
            assert holder.status == 200 and holder.next_event() is not None
            refused = post(small.http_port, "/v1/completions", {"prompt": [3, 4], "max_tokens": 2})
            assert refused.status == 429 and refused.body["error"]["type"] == "rate_limit_error"
            assert "queue full" in refused.body["error"]["message"]
            assert stream(small.http_port, "/v1/chat/completions", {"messages": USER}).status == 429
        finally:
            holder.close()
        for _ in range(50):  # the seat comes back once the abandoned call has unwound
            reply = post(small.http_port, "/v1/completions", {"prompt": [3, 4], "max_tokens": 2})
            if reply.status == 200:
                break
            assert reply.status == 429
            time.sleep(0.1)
        else:
            pytest.fail("the router never admitted a request again")
        assert decode_idle(cluster.decode, timeout_s=5.0)
    finally:
        small.stop()


def test_stop_cancels_streams_in_flight(cluster):
    front = OpenAIFront(f"127.0.0.1:{cluster.router.port}", "127.0.0.1", 0)
    open_stream = OpenStream(front.port, "/v1/completions", LONG)
    try:
        assert open_stream.next_event() is not None
        started = time.monotonic()
        front.stop()
        assert time.monotonic() - started < 5
        while open_stream.next_event() is not None:
            pass  # the stream ends (cut short) instead of running for 4000 tokens
    finally:
        open_stream.close()
    assert decode_idle(cluster.decode, timeout_s=3.0)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", front.port), timeout=2).close()
    front.stop()  # idempotent


def test_a_taken_port_is_a_value_error_naming_http_port(cluster):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        with pytest.raises(ValueError, match="http_port"):
            OpenAIFront(f"127.0.0.1:{cluster.router.port}", "127.0.0.1", taken.getsockname()[1])
    finally:
        taken.close()


def test_the_front_keeps_serving_after_bad_requests(cluster):
    bad = [(path, body) for path, body, *_ in BAD_REQUESTS] * 2
    with ThreadPoolExecutor(8) as pool:
        statuses = list(
            pool.map(
                lambda item: (
                    post(
                        cluster.port,
                        "/v1/chat/completions" if item[0] == "chat" else "/v1/completions",
                        item[1],
                    ).status
                ),
                bad,
            )
        )
    assert statuses == [400] * len(bad)
    reply = post(cluster.port, "/v1/completions", {"prompt": [7, 8, 9], "max_tokens": 3, "ignore_eos": True})
    assert reply.status == 200 and reply.body["usage"]["completion_tokens"] == 3
    assert get(cluster.port, "/health").status == 200
    assert decode_idle(cluster.decode, timeout_s=3.0)


def test_an_unreachable_router_is_503():
    spare = socket.socket()
    spare.bind(("127.0.0.1", 0))
    dead = spare.getsockname()[1]  # bound but not listening: connections are refused
    front = OpenAIFront(f"127.0.0.1:{dead}", "127.0.0.1", 0)
    try:
        health = get(front.port, "/health")
        assert health.status == 503 and health.body["error"]["type"] == "service_unavailable"
        assert get(front.port, "/v1/models").status == 503
        reply = post(front.port, "/v1/completions", {"prompt": "hi"})
        assert reply.status == 503 and reply.body["error"]["code"] == "unavailable"
    finally:
        front.stop()
        spare.close()
