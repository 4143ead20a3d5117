"""Structured output over a real cluster (router -> prefill -> decode, the prefill's first token
constrained too): ``response_format`` json_schema output, streamed and not, parses and validates at
temperature 1 (a random model never writes JSON by itself); json_object output parses; a gRPC regex
request fullmatches; every bad spec is refused before any worker sees it: HTTP 400 naming the field,
gRPC INVALID_ARGUMENT naming ``sampling.structured_output.<kind>``."""

import json
import re

import grpc
import jsonschema
import pytest

from common.tokenizer import Tokenizer
from proto.baton.v1 import generation_pb2
from tests.router_http.client import post, stream

PROMPT = list(range(40, 60))
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "n": {"type": "integer", "minimum": 0, "maximum": 999},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "n", "ok"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA, "strict": True}}
CHAT = {"messages": [{"role": "user", "content": "an item, please"}]}


@pytest.mark.parametrize("seed", [0, 1, 2], ids=lambda s: f"seed{s}")
def test_completions_json_schema_output_validates(cluster, seed):
    body = {"prompt": PROMPT, "max_tokens": 120, "temperature": 1.0, "seed": seed, "response_format": FORMAT}
    reply = post(cluster.port, "/v1/completions", body)
    assert reply.status == 200, reply.body
    choice = reply.body["choices"][0]
    assert choice["finish_reason"] == "stop", choice["text"]
    jsonschema.validate(json.loads(choice["text"]), SCHEMA)


@pytest.mark.parametrize("seed", [3, 4], ids=lambda s: f"seed{s}")
def test_streamed_chat_json_schema_output_validates(cluster, seed):
    body = {
        **CHAT,
        "max_tokens": 120,
        "temperature": 1.0,
        "seed": seed,
        "response_format": FORMAT,
        "stream": True,
    }
    reply = stream(cluster.port, "/v1/chat/completions", body)
    assert reply.status == 200
    chunks = reply.chunks()
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    jsonschema.validate(json.loads(text), SCHEMA)


def test_json_object_output_parses(cluster):
    tokenizer = Tokenizer.from_pretrained(cluster.model)
    # a bias toward the closing tokens so a random model's strings end (the mask still decides)
    closers = {
        str(i): 6 for i in range(tokenizer.vocab_size) if tokenizer.decode([i]) in ('"', "}", '":', '",')
    }
    body = {
        **CHAT,
        "max_tokens": 100,
        "temperature": 1.0,
        "seed": 1,
        "logit_bias": closers,
        "response_format": {"type": "json_object"},
    }
    reply = post(cluster.port, "/v1/chat/completions", body)
    assert reply.status == 200, reply.body
    assert isinstance(json.loads(reply.body["choices"][0]["message"]["content"]), dict)


def test_text_is_unconstrained(cluster):
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "response_format": {"type": "text"}}
    assert post(cluster.port, "/v1/completions", body).status == 200


def test_grpc_regex_output_fullmatches(cluster):
    pattern = r"[a-z]{2,5}-[0-9]{3}"
    for seed in (0, 1):
        sampling = generation_pb2.SamplingParameters(max_tokens=40, temperature=1.0, seed=seed)
        sampling.structured_output.regex = pattern
        request = generation_pb2.GenerateRequest(
            token_ids=generation_pb2.TokenIds(ids=PROMPT), sampling=sampling
        )
        messages = list(cluster.stub.Generate(request, timeout=60))
        text = "".join(m.text for m in messages)
        assert messages[-1].finish_reason == generation_pb2.FINISH_REASON_STOP
        assert re.fullmatch(pattern, text), text


def _schema_format(schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


SCHEMA_FIELD = "response_format.json_schema.schema"
BAD_HTTP = [
    ("invalid-type", _schema_format({"type": "strin"}), SCHEMA_FIELD, "Invalid type: strin"),
    (
        "unsupported-keyword",
        _schema_format({"not": {"type": "string"}}),
        SCHEMA_FIELD,
        'Unimplemented keys: ["not"]',
    ),
    ("bad-ref", _schema_format({"$ref": "#/nope"}), SCHEMA_FIELD, "Pointer '/nope' does not exist"),
    ("schema-not-object", _schema_format([1]), SCHEMA_FIELD, "must be a JSON Schema object"),
    (
        "unknown-type",
        {"type": "yaml"},
        "response_format.type",
        "must be one of text, json_object, json_schema",
    ),
    ("not-object", "json", "response_format", "must be an object"),
    ("no-json-schema", {"type": "json_schema"}, "response_format.json_schema", "must be an object"),
    (
        "bad-name",
        {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}},
        "response_format.json_schema.name",
        "must match",
    ),
    (
        "strict-not-bool",
        {"type": "json_schema", "json_schema": {"name": "a", "schema": {}, "strict": "yes"}},
        "response_format.json_schema.strict",
        "must be a boolean",
    ),
]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize(("case", "value", "param", "words"), BAD_HTTP, ids=[c[0] for c in BAD_HTTP])
def test_bad_response_format_is_400_naming_the_field(cluster, endpoint, case, value, param, words):
    if endpoint == "chat":
        path, body = "/v1/chat/completions", {**CHAT, "response_format": value}
    else:
        path, body = "/v1/completions", {"prompt": PROMPT, "response_format": value}
    reply = post(cluster.port, path, body)
    assert reply.status == 400, reply.body
    error = reply.body["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert error["message"].startswith(f"{param}: ") and words in error["message"], error["message"]
    assert stream(cluster.port, path, body).status == 400


def _bad_grpc():
    def sampling(**kind):
        message = generation_pb2.SamplingParameters(max_tokens=2)
        for name, value in kind.items():
            setattr(message.structured_output, name, value)
        return message

    return [
        ("schema-not-json", sampling(json_schema="{"), "sampling.structured_output.json_schema: not JSON"),
        (
            "schema-array",
            sampling(json_schema="[1]"),
            "sampling.structured_output.json_schema: a JSON Schema is",
        ),
        (
            "schema-keyword",
            sampling(json_schema='{"if": {}, "then": {}}'),
            "sampling.structured_output.json_schema: cannot be compiled: Unimplemented keys",
        ),
        ("regex", sampling(regex="[a-"), "sampling.structured_output.regex: cannot be compiled"),
        ("regex-empty", sampling(regex=""), "sampling.structured_output.regex: must not be empty"),
        (
            "grammar",
            sampling(grammar="start: missing_rule"),
            "sampling.structured_output.grammar: cannot be compiled",
        ),
        (
            "json-object-false",
            sampling(json_object=False),
            "sampling.structured_output.json_object: must be true",
        ),
        ("too-big", sampling(regex="a" * 70_000), "sampling.structured_output.regex: 70000 bytes, more than"),
    ]


def test_bad_specs_are_invalid_argument_over_grpc(cluster):
    for name, sampling, words in _bad_grpc():
        request = generation_pb2.GenerateRequest(
            token_ids=generation_pb2.TokenIds(ids=PROMPT), sampling=sampling
        )
        with pytest.raises(grpc.RpcError) as caught:
            list(cluster.stub.Generate(request, timeout=30))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        assert caught.value.details().startswith(words), (name, caught.value.details())
