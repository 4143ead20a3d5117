"""The bad inputs users reported (2026-11-30), one by one: each is refused with 4xx or
INVALID_ARGUMENT naming the field, cheaply, and the router keeps serving."""

import json
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2

from common.limits import MAX_LABEL_CHARS, MAX_STOP_STRINGS
from deploy.benchmark.fuzz_bench import FUZZ_MAX_MODEL_LEN
from proto.baton.v1 import generation_pb2
from tests.router_http.client import post

USER = [{"role": "user", "content": "hi"}]
SURROGATE = "\ud800"


def _error(reply) -> dict:
    return reply.body["error"]


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/completions", {"prompt": f"a{SURROGATE}b"}, "prompt"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": SURROGATE}]},
            "messages[0].content",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": SURROGATE}]}]},
            "messages[0].content[0].text",
        ),
        ("/v1/completions", {"prompt": "hi", "stop": ["ok", SURROGATE]}, "stop[1]"),
        ("/v1/completions", {"prompt": "hi", "stop": SURROGATE}, "stop"),
        ("/v1/completions", {"prompt": "hi", "tenant": SURROGATE}, "tenant"),
    ],
    ids=["prompt", "chat-content", "chat-part", "stop-list", "stop-string", "tenant"],
)
def test_a_lone_surrogate_is_400_naming_the_field(cluster, path, body, param):
    reply = post(cluster.router.http_port, path, json.dumps(body).encode())  # JSON escapes it: \ud800
    assert reply.status == 400 and _error(reply)["param"] == param, reply.body
    assert "lone UTF-16 surrogate U+D800" in _error(reply)["message"]


def test_deep_json_is_400_at_any_depth(cluster):
    for depth in (40, 100_000):
        raw = b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}"
        reply = post(cluster.router.http_port, "/v1/completions", raw)
        assert reply.status == 400 and _error(reply)["param"] == "body", reply.body
        assert "nested deeper than 32 levels" in _error(reply)["message"]


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_a_body_that_is_not_json_is_415(cluster, content_type):
    reply = post(
        cluster.router.http_port, "/v1/completions", b'{"prompt": "hi"}', {"Content-Type": content_type}
    )
    assert reply.status == 415 and _error(reply)["param"] == "Content-Type", reply.body


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"prompt": "hi", "user": "u" * (MAX_LABEL_CHARS + 1)}, "user", "257 characters"),
        ({"prompt": "hi", "stop": ["x"] * (MAX_STOP_STRINGS + 1)}, "stop", "17 strings"),
        ({"prompt": "hi", "stop_token_ids": [5000]}, "stop_token_ids[0]", "outside the vocabulary"),
        ({"prompt": "hi", "temperature": 10**400}, "temperature", "must be a number"),  # past float
        ({"messages": [{"role": ["user"], "content": "x"}]}, "messages[0].role", "must be one of"),
    ],
    ids=["user-label", "stop-count", "stop-id-vocab", "huge-int", "role-list"],
)
def test_oversized_and_out_of_range_fields_are_400(cluster, body, param, words):
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    reply = post(cluster.router.http_port, path, body)
    assert reply.status == 400 and _error(reply)["param"] == param, reply.body
    assert words in _error(reply)["message"]


def test_a_huge_request_id_is_refused_before_any_token_is_echoed(cluster):
    request = generation_pb2.GenerateRequest(request_id="r" * 2**20, token_ids={"ids": [1, 2]})
    with pytest.raises(grpc.RpcError) as refused:
        list(cluster.stub.Generate(request, timeout=30))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith("request_id: 1048576 characters, more than the limit of 256")


def test_a_prompt_that_cannot_fit_is_refused_from_its_bytes_at_once(cluster):
    """3.5 MB of text: refused without tokenizing (which takes seconds), on both surfaces."""
    text = "hello world " * 300_000
    started = time.monotonic()
    reply = post(cluster.router.http_port, "/v1/completions", {"prompt": text})
    assert reply.status == 400 and _error(reply)["param"] == "prompt", reply.body
    assert f"leave no room under max_model_len ({FUZZ_MAX_MODEL_LEN})" in _error(reply)["message"]
    with pytest.raises(grpc.RpcError) as refused:
        list(cluster.stub.Generate(generation_pb2.GenerateRequest(text=text), timeout=30))
    assert refused.value.details().startswith("text: 3600000 bytes make at least")
    assert time.monotonic() - started < 1.5  # tokenizing the text once alone takes about 5 s here


def test_a_tokenized_prompt_past_max_model_len_is_refused_at_the_router(cluster):
    request = generation_pb2.GenerateRequest(token_ids={"ids": [1] * FUZZ_MAX_MODEL_LEN})
    with pytest.raises(grpc.RpcError) as refused:
        list(cluster.stub.Generate(request, timeout=30))
    assert (
        refused.value.details()
        == f"token_ids: {FUZZ_MAX_MODEL_LEN} tokens leave no room under max_model_len ({FUZZ_MAX_MODEL_LEN})"
    )


BROKEN = {
    "endless-varint": b"\x08" + b"\xff" * 12,
    "length-past-end": b"\x1a\x7f",
    "cut-fixed32": b"\x1d\x00",
}
# A string field holding bytes that are not UTF-8: GenerateRequest.text (3), TokenizeRequest.text
# (2), HealthCheckRequest.service (1); ListModelsRequest has no string field.
BAD_UTF8 = {
    "/baton.v1.Generation/Generate": b"\x1a\x02\xff\xfe",
    "/baton.v1.Generation/Tokenize": b"\x12\x02\xff\xfe",
    "/grpc.health.v1.Health/Check": b"\x0a\x02\xff\xfe",
}
MALFORMED = [
    (method, name, payload)
    for method in (*BAD_UTF8, "/baton.v1.Generation/ListModels")
    for name, payload in BROKEN.items()
]
MALFORMED += [(method, "bad-utf8-string", payload) for method, payload in BAD_UTF8.items()]


@pytest.mark.parametrize(
    "method, payload",
    [(m, p) for m, _, p in MALFORMED],
    ids=[f"{m.rsplit('/', 1)[1]}-{n}" for m, n, _ in MALFORMED],
)
def test_malformed_protobuf_is_invalid_argument_and_the_router_serves_on(cluster, method, payload):
    streaming = method.endswith("/Generate")
    call = (cluster.channel.unary_stream if streaming else cluster.channel.unary_unary)(method)
    with pytest.raises(grpc.RpcError) as refused:
        reply = call(payload, timeout=30)
        if streaming:
            list(reply)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT, refused.value
    assert refused.value.details().startswith(f"request: not a valid protobuf message for {method}")
    check = cluster.channel.unary_unary(
        "/grpc.health.v1.Health/Check", response_deserializer=health_pb2.HealthCheckResponse.FromString
    )
    assert check(b"", timeout=10).status == health_pb2.HealthCheckResponse.SERVING
