"""The SDK's tool-calling side without a server: requests carry tools and tool-call turns, streamed
call pieces join into a ``Completion``'s calls, bad shapes raise ``InvalidRequest`` naming the argument."""

import pytest

from proto.baton.v1 import generation_pb2
from sdk import Completion, InvalidRequest, ToolCall, generate_request
from sdk.types import chunk_from_pb

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def test_tools_choice_and_tool_turns_reach_the_chat():
    call = {
        "id": "functions.get_weather:0",
        "function": {"name": "get_weather", "arguments": {"city": "Oslo"}},
    }
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "cold"},
    ]
    chat = generate_request(
        messages=messages,
        tools=[WEATHER, {"name": "get_time"}],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        parallel_tool_calls=False,
    ).chat
    assert [(t.name, t.parameters) for t in chat.tools] == [
        ("get_weather", '{"type": "object"}'),
        ("get_time", ""),
    ]
    assert chat.tool_choice.mode == generation_pb2.ToolChoice.MODE_FUNCTION
    assert chat.tool_choice.function_name == "get_time" and chat.single_tool_call
    [sent] = chat.messages[1].tool_calls
    assert (sent.id, sent.name, sent.arguments) == (
        "functions.get_weather:0",
        "get_weather",
        '{"city": "Oslo"}',
    )
    assert chat.messages[1].content == "" and chat.messages[2].tool_call_id == "functions.get_weather:0"
    assert generate_request(messages=messages[:1], tool_choice="required").chat.tool_choice.mode == 2


@pytest.mark.parametrize(
    "options, name",
    [
        ({"tools": "get_weather"}, "tools"),
        ({"tools": [{"type": "function"}]}, "tools[0]"),
        ({"tools": [{"name": "f", "parameters": "{}"}]}, "tools[0].parameters"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"parallel_tool_calls": 1}, "parallel_tool_calls"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"id": "x"}]}]}, "messages[0].tool_calls[0]"),
    ],
    ids=["tools-string", "no-function", "parameters-text", "choice", "parallel", "call-shape"],
)
def test_bad_shapes_name_the_argument(options, name):
    options = {"messages": [{"role": "user", "content": "x"}], **options}
    with pytest.raises(InvalidRequest) as caught:
        generate_request(**options)
    assert str(caught.value).startswith(f"INVALID_ARGUMENT: {name}: "), str(caught.value)


def test_tools_need_a_chat():
    with pytest.raises(InvalidRequest, match="^INVALID_ARGUMENT: tools: "):
        generate_request("text", tools=[WEATHER])


def test_streamed_pieces_join_into_calls():
    pieces = [
        generation_pb2.GenerateResponse(
            text="Ok.", tool_calls=[generation_pb2.ToolCall(index=0, id="a", name="f")]
        ),
        generation_pb2.GenerateResponse(tool_calls=[generation_pb2.ToolCall(index=0, arguments='{"x":')]),
        generation_pb2.GenerateResponse(
            tool_calls=[
                generation_pb2.ToolCall(index=0, arguments="1}"),
                generation_pb2.ToolCall(index=1, id="b", name="g", arguments="{}"),
            ],
            finish_reason=generation_pb2.FINISH_REASON_TOOL_CALLS,
        ),
    ]
    chunks = [chunk_from_pb(p) for p in pieces]
    assert chunks[0].tool_calls[0].name == "f" and chunks[-1].finish_reason == "tool_calls"
    result = Completion.from_chunks(chunks)
    assert result.text == "Ok." and result.tool_calls == (
        ToolCall("a", "f", '{"x":1}'),
        ToolCall("b", "g", "{}"),
    )
