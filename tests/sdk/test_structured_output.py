"""``generate_request(structured_output=...)``: each kind lands in its ``StructuredOutput`` field (a
schema dict as JSON text); wrong shapes raise ``InvalidRequest`` naming the argument; the SDK itself
compiles nothing (that is the server's)."""

import json

import pytest

from sdk import InvalidRequest, generate_request

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


@pytest.mark.parametrize(
    ("value", "kind", "expected"),
    [
        ({"json_schema": SCHEMA}, "json_schema", json.dumps(SCHEMA)),
        ({"json_schema": '{"type": "string"}'}, "json_schema", '{"type": "string"}'),
        ({"json_object": True}, "json_object", True),
        ({"regex": "[a-z]+"}, "regex", "[a-z]+"),
        ({"grammar": 'start: "yes" | "no"'}, "grammar", 'start: "yes" | "no"'),
        ({"regex": "[a-"}, "regex", "[a-"),  # not compiled here: the server refuses it
    ],
    ids=["schema-dict", "schema-text", "json-object", "regex", "grammar", "bad-regex-passes"],
)
def test_each_kind_reaches_its_field(value, kind, expected):
    sampling = generate_request("hi", structured_output=value).sampling
    assert sampling.HasField("structured_output")
    assert sampling.structured_output.WhichOneof("kind") == kind
    assert getattr(sampling.structured_output, kind) == expected


def test_unset_is_unconstrained():
    assert not generate_request("hi").sampling.HasField("structured_output")


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("[a-z]+", "structured_output: expected a dict with one key"),
        ({}, "structured_output: expected a dict with one key"),
        ({"regex": "a", "grammar": "b"}, "structured_output: expected a dict with one key"),
        ({"yaml": "a"}, "structured_output: expected a dict with one key"),
        ({"json_object": 1}, "structured_output.json_object: expected True"),
        ({"regex": 5}, "structured_output.regex: expected a string"),
    ],
    ids=["string", "empty", "two-keys", "unknown-kind", "json-object-1", "regex-int"],
)
def test_bad_shapes_are_rejected_naming_the_argument(value, words):
    with pytest.raises(InvalidRequest, match=words.replace(".", r"\.")):
        generate_request("hi", structured_output=value)
