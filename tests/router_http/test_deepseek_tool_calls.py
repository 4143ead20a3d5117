"""Tool calls through a DeepSeek-layout cluster (``deepseek_v32``: real prefill and decode workers and a
router with its OpenAI front), nothing scripted: a forced named call and a ``required`` one come back
parsed from the DeepSeek markers, with the name the head wrote and arguments valid under the schema."""

import json

import jsonschema
import pytest

from router.server import RouterConfig, RouterServer
from tests.router_http.client import post
from tests.router_http.test_forced_tool_calls import CITY, SCHEMAS, TOOLS, USER
from tests.services.workers import running_workers


@pytest.fixture(scope="module")
def deepseek(tiny_checkpoint):
    """The OpenAI front's port of a DeepSeek-layout cluster."""
    model = tiny_checkpoint("deepseek_v32")
    flags = ("--dtype", "float32")
    with running_workers(model, ("decode", *flags), ("prefill", *flags)) as (decode, prefill):
        router = RouterServer(
            RouterConfig(
                model=str(model), prefill=(prefill.address,), decode=(decode.address,), port=0, http_port=0
            )
        )
        try:
            yield router.http_port
        finally:
            router.stop()


def _body(choice, seed: int) -> dict:
    return {
        "messages": USER,
        "tools": TOOLS,
        "tool_choice": choice,
        "max_tokens": 60,
        "temperature": 1.0,
        "seed": seed,
    }


def test_a_named_call_parses_from_the_deepseek_markers(deepseek):
    reply = post(
        deepseek, "/v1/chat/completions", _body({"type": "function", "function": {"name": "get_weather"}}, 3)
    )
    assert reply.status == 200, reply.body
    (answer,) = reply.body["choices"]
    assert answer["finish_reason"] == "tool_calls"
    (call,) = answer["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and call["id"].startswith(
        "call_"
    )  # the layout has no id
    jsonschema.validate(json.loads(call["function"]["arguments"]), CITY)


@pytest.mark.parametrize("seed", [1, 2])
def test_required_names_a_declared_function_in_the_deepseek_head(deepseek, seed):
    reply = post(deepseek, "/v1/chat/completions", _body("required", seed))
    assert reply.status == 200, reply.body
    (call,) = reply.body["choices"][0]["message"]["tool_calls"]
    name = call["function"]["name"]
    assert name in SCHEMAS
    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])
