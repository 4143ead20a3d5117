"""Tool calls over the OpenAI front and the gRPC API, on the real cluster.

A random tiny model writes no tool calls by itself, so ``scripted`` puts a test double at the
workers' output: the router's ``Migrator.run`` still runs the request on the real workers (the
prompt they receive is recorded), but the generated token ids are replaced by the tokens of a
scripted assistant turn, and a run that ends on the script's last token ends with STOP (the model's
stop token). Everything after that boundary is the real router: the detokenizer keeping the marker
tokens, the family's parser, the gRPC messages, the OpenAI front and the SDKs.
"""

import json

import grpc
import openai
import pytest

from common.tokenizer import Tokenizer
from proto.baton.v1 import generation_pb2
from router.migration import Migrator
from sdk import Client
from tests.router_http.client import post, stream

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
USER = [{"role": "user", "content": "Weather in Paris?"}]
ARGS = '{"city": "Paris"}'


def _call(name: str, index: int, arguments: str) -> str:
    return (
        f"<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>{arguments}<|tool_call_end|>"
    )


ONE_CALL = (
    "Checking.<|tool_calls_section_begin|>"
    + _call("get_weather", 0, ARGS)
    + "<|tool_calls_section_end|><|im_end|>"
)
TWO_CALLS = (
    "<|tool_calls_section_begin|>"
    + _call("get_weather", 0, ARGS)
    + _call("get_time", 1, '{"tz": "CET"}')
    + "<|tool_calls_section_end|><|im_end|>"
)


@pytest.fixture
def tokenizer(cluster):
    return Tokenizer.from_pretrained(cluster.model)


@pytest.fixture
def scripted(monkeypatch, tokenizer):
    """``scripted(text)`` -> (the script's token count, the prompts the workers received)."""
    prompts: list[list[int]] = []
    real = Migrator.run

    def script(text: str):
        ids = tokenizer.encode(text)

        def run(self, request_id, prompt_ids, request, context, route):
            prompts.append(list(prompt_ids))
            at = 0
            for message in real(self, request_id, prompt_ids, request, context, route):
                count = len(message.token_ids)
                del message.token_ids[:]
                message.token_ids.extend(ids[at : at + count])
                at += count
                if message.finish_reason and at >= len(ids):
                    message.finish_reason = generation_pb2.FINISH_REASON_STOP
                yield message

        monkeypatch.setattr(Migrator, "run", run)
        return len(ids), prompts

    return script


def _body(count: int, **extra) -> dict:
    return {
        "messages": USER,
        "tools": [WEATHER],
        "max_tokens": count,
        "ignore_eos": True,
        "temperature": 0,
        **extra,
    }


def test_a_tool_call_comes_back_as_message_tool_calls(cluster, scripted, tokenizer):
    count, prompts = scripted(ONE_CALL)
    reply = post(cluster.port, "/v1/chat/completions", _body(count))
    assert reply.status == 200, reply.body
    [choice] = reply.body["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {
                "id": "functions.get_weather:0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": ARGS},
            }
        ],
    }
    # the tools reached the prompt the workers ran: the template's tool_declare turn
    prompt = tokenizer.decode(prompts[-1])
    assert prompt == tokenizer.apply_chat_template(USER, [WEATHER], add_generation_prompt=True)
    assert "tool_declare" in prompt and '"get_weather"' in prompt


def test_streamed_deltas_join_to_the_same_call(cluster, scripted):
    count, _ = scripted(ONE_CALL)
    whole = post(cluster.port, "/v1/chat/completions", _body(count)).body["choices"][0]
    streamed = stream(cluster.port, "/v1/chat/completions", _body(count))
    assert streamed.status == 200 and streamed.events[-1] == "[DONE]"
    deltas = [c["choices"][0]["delta"] for c in streamed.chunks()]
    assert "".join(d.get("content", "") for d in deltas) == "Checking."
    pieces = [p for d in deltas for p in d.get("tool_calls", [])]
    first, rest = pieces[0], pieces[1:]
    assert first["index"] == 0 and first["id"] == "functions.get_weather:0" and first["type"] == "function"
    assert first["function"]["name"] == "get_weather"
    assert all(set(p) == {"index", "function"} and set(p["function"]) == {"arguments"} for p in rest)
    assert "".join(p["function"]["arguments"] for p in pieces) == ARGS
    assert len(rest) > 1  # the arguments arrived piece by piece, not at the call's end
    assert streamed.chunks()[-1]["choices"][0]["finish_reason"] == "tool_calls" == whole["finish_reason"]


def test_without_tools_or_with_tool_choice_none_the_output_stays_text(cluster, scripted, tokenizer):
    count, prompts = scripted(ONE_CALL)
    plain = {k: v for k, v in _body(count).items() if k != "tools"}
    for body in (plain, _body(count, tool_choice="none")):
        [choice] = post(cluster.port, "/v1/chat/completions", body).body["choices"]
        assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
        assert choice["message"]["content"] == f"Checking.functions.get_weather:0{ARGS}"  # markers skipped
    assert "tool_declare" not in tokenizer.decode(prompts[0]) and "tool_declare" in tokenizer.decode(
        prompts[1]
    )


def test_parallel_tool_calls_false_keeps_the_first(cluster, scripted):
    count, _ = scripted(TWO_CALLS)
    [both] = post(cluster.port, "/v1/chat/completions", _body(count, tools=[WEATHER, TIME])).body["choices"]
    assert [c["function"]["name"] for c in both["message"]["tool_calls"]] == ["get_weather", "get_time"]
    assert both["message"]["content"] is None
    body = _body(count, tools=[WEATHER, TIME], parallel_tool_calls=False)
    [one] = post(cluster.port, "/v1/chat/completions", body).body["choices"]
    assert [c["function"]["name"] for c in one["message"]["tool_calls"]] == ["get_weather"]


def test_a_named_tool_choice_prefills_the_call(cluster, scripted, tokenizer):
    count, prompts = scripted('{"tz": "UTC"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>')
    body = _body(
        count, tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}}
    )
    [choice] = post(cluster.port, "/v1/chat/completions", body).body["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"] == [
        {
            "id": "functions.get_time:0",
            "type": "function",
            "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'},
        }
    ]
    assert tokenizer.decode(prompts[-1]).endswith(
        "<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|><|tool_call_begin|>"
        "functions.get_time:0<|tool_call_argument_begin|>"
    )


def test_tool_choice_required_prefills_a_call_opening(cluster, scripted, tokenizer):
    count, prompts = scripted(
        f"functions.get_weather:0<|tool_call_argument_begin|>{ARGS}<|tool_call_end|><|tool_calls_section_end|>"
    )
    [choice] = post(cluster.port, "/v1/chat/completions", _body(count, tool_choice="required")).body[
        "choices"
    ]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert [c["function"]["arguments"] for c in choice["message"]["tool_calls"]] == [ARGS]
    assert tokenizer.decode(prompts[-1]).endswith(
        "<|im_middle|><|tool_calls_section_begin|><|tool_call_begin|>"
    )


def test_the_call_and_its_result_are_rendered_in_the_next_turn(cluster, scripted, tokenizer):
    count, prompts = scripted("It is 22C in Paris.<|im_end|>")
    call = {
        "id": "functions.get_weather:0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ARGS},
    }
    messages = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "22C, sunny"},
    ]
    reply = post(cluster.port, "/v1/chat/completions", {**_body(count), "messages": messages})
    [choice] = reply.body["choices"]
    assert choice["message"]["content"] == "It is 22C in Paris." and choice["finish_reason"] == "stop"
    prompt = tokenizer.decode(prompts[-1])
    expected = [{**m, "content": m["content"] or ""} for m in messages]
    assert prompt == tokenizer.apply_chat_template(expected, [WEATHER], add_generation_prompt=True)
    assert _call("get_weather", 0, ARGS) in prompt
    assert (
        "<|im_system|>tool<|im_middle|>## Result of functions.get_weather:0\n22C, sunny<|im_end|>" in prompt
    )


def test_the_openai_sdk_sends_tools_and_reads_the_call(cluster, scripted):
    count, _ = scripted(ONE_CALL)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{cluster.port}/v1", api_key="unused", max_retries=0)
    args = dict(model=cluster.model.name, messages=USER, tools=[WEATHER], max_tokens=count, temperature=0)
    reply = client.chat.completions.create(**args, extra_body={"ignore_eos": True})
    [call] = reply.choices[0].message.tool_calls
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == (
        "functions.get_weather:0",
        "get_weather",
        {"city": "Paris"},
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    chunks = list(client.chat.completions.create(**args, stream=True, extra_body={"ignore_eos": True}))
    pieces = [p for c in chunks for p in (c.choices[0].delta.tool_calls or [])]
    assert pieces[0].function.name == "get_weather"
    assert "".join(p.function.arguments or "" for p in pieces) == ARGS
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(**args, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert refused.value.body["param"] == "tool_choice"


def test_the_sdk_returns_parsed_calls(cluster, scripted):
    count, _ = scripted(TWO_CALLS)
    with Client(f"127.0.0.1:{cluster.router.port}", timeout_s=60) as client:
        result = client.generate(messages=USER, tools=[WEATHER, TIME], max_tokens=count, ignore_eos=True)
    assert result.finish_reason == "tool_calls" and result.text == ""
    assert [(c.id, c.name, c.arguments) for c in result.tool_calls] == [
        ("functions.get_weather:0", "get_weather", ARGS),
        ("functions.get_time:1", "get_time", '{"tz": "CET"}'),
    ]


def _chat(**fields) -> generation_pb2.GenerateRequest:
    chat = generation_pb2.Chat(messages=[generation_pb2.ChatMessage(role="user", content="hi")], **fields)
    return generation_pb2.GenerateRequest(chat=chat, sampling=generation_pb2.SamplingParameters(max_tokens=2))


def _tool(name="f", parameters="") -> generation_pb2.Tool:
    return generation_pb2.Tool(name=name, parameters=parameters)


GRPC_REFUSALS = {
    "bad_name": (_chat(tools=[_tool("get weather")]), "chat.tools[0].name: must match"),
    "empty_name": (_chat(tools=[_tool("")]), "chat.tools[0].name: must be a non-empty string"),
    "twice": (_chat(tools=[_tool(), _tool()]), "chat.tools[1].name: 'f' is declared twice"),
    "parameters_array": (
        _chat(tools=[_tool(parameters="[1]")]),
        "chat.tools[0].parameters: must be a JSON object",
    ),
    "parameters_not_json": (
        _chat(tools=[_tool(parameters="{")]),
        "chat.tools[0].parameters: must be a JSON object",
    ),
    "too_many": (_chat(tools=[_tool(f"f{i}") for i in range(129)]), "chat.tools: 129 tools"),
    "unknown_function": (
        _chat(tools=[_tool()], tool_choice=generation_pb2.ToolChoice(mode=3, function_name="g")),
        "chat.tool_choice.function_name: 'g' is not one of chat.tools",
    ),
    "required_without_tools": (
        _chat(tool_choice=generation_pb2.ToolChoice(mode=2)),
        "chat.tool_choice: MODE_REQUIRED needs chat.tools",
    ),
    "calls_on_a_user_turn": (
        generation_pb2.GenerateRequest(
            chat=generation_pb2.Chat(
                messages=[
                    generation_pb2.ChatMessage(role="user", tool_calls=[generation_pb2.ToolCall(name="f")])
                ]
            )
        ),
        "chat.messages[0].tool_calls: only assistant messages",
    ),
}


@pytest.mark.parametrize("request_, words", GRPC_REFUSALS.values(), ids=GRPC_REFUSALS.keys())
def test_grpc_refuses_bad_tools_naming_the_field(cluster, request_, words):
    with pytest.raises(grpc.RpcError) as refused:
        list(cluster.stub.Generate(request_, timeout=30))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith(words), refused.value.details()


def test_http_names_the_tool_fields(cluster):
    bad = {
        "tools": [{"type": "function", "function": {"name": "a b"}}],
    }
    cases = [
        (bad, "tools[0].function.name"),
        ({"tools": [WEATHER] * 129}, "tools"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]},
            "tools[0].function.parameters",
        ),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"function_call": "auto"}, "function_call"),
    ]
    for extra, param in cases:
        reply = post(cluster.port, "/v1/chat/completions", {"messages": USER, "max_tokens": 1, **extra})
        assert reply.status == 400 and reply.body["error"]["param"] == param, (extra, reply.body)
