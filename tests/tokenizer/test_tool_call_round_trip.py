"""Each family's parser reads back what its chat template renders for an assistant turn with tool
calls: from the text, and from the token ids through the streaming detokenizer that keeps the markers."""

import json

from common.tokenizer import IncrementalDetokenizer
from common.tool_calls import ToolCall, ToolCallParser, parse_tool_calls, tool_call_format

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
CALLS = [
    {
        "id": "functions.get_weather:0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    },
    {
        "id": "functions.get_time:1",
        "type": "function",
        "function": {"name": "get_time", "arguments": {"tz": "CET"}},
    },
]
USER = [{"role": "user", "content": "Weather and time in Paris?"}]
ASSISTANT = {"role": "assistant", "content": "Let me look.", "tool_calls": CALLS}


def _expected(family: str) -> tuple[ToolCall, ...]:
    kimi = family != "deepseek_v32"
    return tuple(
        ToolCall(
            call["id"] if kimi else f"call_{i}",
            call["function"]["name"],
            a if isinstance(a := call["function"]["arguments"], str) else json.dumps(a),
        )
        for i, call in enumerate(CALLS)
    )


def _ids():
    count = iter(range(100))
    return lambda: f"call_{next(count)}"


def test_the_rendered_assistant_turn_parses_back(tokenizer, family):
    prompt = tokenizer.apply_chat_template(USER, TOOLS, add_generation_prompt=True)
    whole = tokenizer.apply_chat_template([*USER, ASSISTANT], TOOLS, add_generation_prompt=False)
    assert whole.startswith(prompt)
    fmt = tool_call_format(family)
    turn = whole[len(prompt) :]
    stop = next(t for t in ("<|im_end|>", "<｜end▁of▁sentence｜>") if turn.endswith(t))
    parsed = parse_tool_calls(turn.removesuffix(stop), fmt, _ids())
    assert parsed.content == "Let me look." and parsed.tool_calls == _expected(family)


def test_the_turn_token_by_token_through_the_detokenizer(tokenizer, family):
    prompt_ids = tokenizer.encode(tokenizer.apply_chat_template(USER, TOOLS, add_generation_prompt=True))
    ids = tokenizer.encode(
        tokenizer.apply_chat_template([*USER, ASSISTANT], TOOLS, add_generation_prompt=False)
    )
    assert ids[: len(prompt_ids)] == prompt_ids
    fmt = tool_call_format(family)
    keep = frozenset(tokenizer.token_to_id(m) for m in fmt.markers)
    assert None not in keep  # every marker is one token of the family's vocabulary
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=True, keep_token_ids=keep)
    parser = ToolCallParser(fmt, _ids())
    content, calls = [], {}
    for token in ids[len(prompt_ids) :]:  # the stop token is special and skipped
        piece, deltas = parser.feed(detokenizer.push(token))
        content.append(piece)
        for d in deltas:
            calls.setdefault(d.index, [d.id, d.name, ""])[2] += d.arguments
    piece, deltas = parser.feed(detokenizer.flush())
    rest, last = parser.finish()
    assert deltas == [] and last == []
    assert "".join(content) + piece + rest == "Let me look."
    assert tuple(ToolCall(*calls[i]) for i in sorted(calls)) == _expected(family)


def test_without_kept_markers_the_detokenizer_drops_them(tokenizer, family):
    text = tool_call_format(family).call_prefix("f")
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=True)
    assert "".join(detokenizer.push(t) for t in tokenizer.encode(text)) + detokenizer.flush() == (
        "functions.f:0" if family != "deepseek_v32" else "f"
    )
