"""A forced ``tool_choice`` (a named function, or ``required``) on the real cluster, nothing scripted:
the router prefills the call's opening and constrains the rest by the call's grammar
(``common/tool_calls/call_grammar.py``), so even the random tiny model returns a parsed call of a
declared function whose arguments are valid under its parameters schema, streamed and whole; a forced
choice with a response format of its own is refused naming the field."""

import json

import jsonschema
import openai
import pytest

from tests.router_http.client import post

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"enum": [1, 2, 3]}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
ZONE = {"type": "object", "properties": {"tz": {"enum": ["CET", "UTC"]}}, "required": ["tz"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": CITY}},
    {"type": "function", "function": {"name": "get_time", "parameters": ZONE}},
]
SCHEMAS = {"get_weather": CITY, "get_time": ZONE}
USER = [{"role": "user", "content": "Weather in Paris?"}]


def _body(choice, **more) -> dict:
    return {"messages": USER, "tools": TOOLS, "tool_choice": choice, "max_tokens": 60, **more}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_named_function_is_called_with_arguments_valid_under_its_schema(cluster, seed):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    reply = post(cluster.port, "/v1/chat/completions", _body(choice, temperature=1.0, seed=seed))
    assert reply.status == 200, reply.body
    (answer,) = reply.body["choices"]
    assert answer["finish_reason"] == "tool_calls"
    (call,) = answer["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and call["id"] == "functions.get_weather:0"
    jsonschema.validate(json.loads(call["function"]["arguments"]), CITY)


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_required_calls_one_declared_function_with_valid_arguments(cluster, seed):
    reply = post(cluster.port, "/v1/chat/completions", _body("required", temperature=1.0, seed=seed))
    assert reply.status == 200, reply.body
    (call,) = reply.body["choices"][0]["message"]["tool_calls"]
    name = call["function"]["name"]
    assert name in SCHEMAS
    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])


def test_the_sdk_streams_a_forced_call_that_equals_the_whole(cluster):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{cluster.port}/v1", api_key="unused", max_retries=0)
    args = dict(model=cluster.model.name, **_body({"type": "function", "function": {"name": "get_time"}}))
    whole = client.chat.completions.create(**args, temperature=0.7, seed=9)
    (call,) = whole.choices[0].message.tool_calls
    pieces = "".join(
        delta.function.arguments or ""
        for chunk in client.chat.completions.create(**args, temperature=0.7, seed=9, stream=True)
        for choice in chunk.choices
        for delta in choice.delta.tool_calls or []
    )
    assert pieces == call.function.arguments
    jsonschema.validate(json.loads(pieces), ZONE)


def test_a_forced_call_with_a_response_format_is_refused(cluster):
    body = _body("required", response_format={"type": "json_object"})
    reply = post(cluster.port, "/v1/chat/completions", body)
    assert reply.status == 400 and reply.body["error"]["param"] == "response_format", reply.body
