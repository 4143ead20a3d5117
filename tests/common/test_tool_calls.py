"""Tool-call parsers: whole texts, char by char and random splits give the same content and calls;
malformed or unterminated markers fall back to content and never raise."""

import itertools
import random

import pytest

from common.tool_calls import ToolCall, ToolCallParser, parse_tool_calls, tool_call_format
from common.tool_calls.parser import merge_deltas

KIMI = tool_call_format("kimi_linear")
DEEPSEEK = tool_call_format("deepseek_v32")


def _kimi(content: str, *calls: tuple[str, str], end: bool = True) -> str:
    body = "".join(
        f"<|tool_call_begin|>functions.{name}:{i}<|tool_call_argument_begin|>{args}<|tool_call_end|>"
        for i, (name, args) in enumerate(calls)
    )
    return f"{content}<|tool_calls_section_begin|>{body}" + ("<|tool_calls_section_end|>" if end else "")


def _deepseek(content: str, *calls: tuple[str, str], end: bool = True) -> str:
    body = "".join(f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{a}<｜tool▁call▁end｜>" for n, a in calls)
    return f"{content}<｜tool▁calls▁begin｜>{body}" + ("<｜tool▁calls▁end｜>" if end else "")


def _ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def _streamed(text: str, fmt, cuts: list[int]):
    parser = ToolCallParser(fmt, _ids())
    content, deltas, at = [], [], 0
    for cut in [*cuts, len(text)]:
        piece, more = parser.feed(text[at:cut])
        content.append(piece)
        deltas += more
        at = cut
    piece, more = parser.finish()
    return "".join(content) + piece, deltas + more


CASES = {
    "kimi_two_calls": (
        KIMI,
        _kimi("Let me check.", ("get_weather", '{"city": "Paris"}'), ("get_time", '{"tz":"CET"}')),
        "Let me check.",
        (
            ToolCall("functions.get_weather:0", "get_weather", '{"city": "Paris"}'),
            ToolCall("functions.get_time:1", "get_time", '{"tz":"CET"}'),
        ),
    ),
    "kimi_no_content": (KIMI, _kimi("", ("f", "{}")), "", (ToolCall("functions.f:0", "f", "{}"),)),
    "kimi_text_only": (KIMI, "Just <|tool text, no call <|", "Just <|tool text, no call <|", ()),
    "kimi_section_without_call": (
        KIMI,
        "a<|tool_calls_section_begin|> b",
        "a<|tool_calls_section_begin|> b",
        (),
    ),
    "kimi_empty_section": (
        KIMI,
        "a<|tool_calls_section_begin|><|tool_calls_section_end|>b",
        "a<|tool_calls_section_begin|><|tool_calls_section_end|>b",
        (),
    ),
    "kimi_unterminated_head": (
        KIMI,
        "a<|tool_calls_section_begin|><|tool_call_begin|>functions.f",
        "a<|tool_calls_section_begin|><|tool_call_begin|>functions.f",
        (),
    ),
    "kimi_head_cut_by_call_end": (
        KIMI,
        "<|tool_calls_section_begin|><|tool_call_begin|>f<|tool_call_end|>x",
        "<|tool_calls_section_begin|><|tool_call_begin|>f<|tool_call_end|>x",
        (),
    ),
    "kimi_unterminated_arguments_kept": (
        KIMI,
        '<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{"a": ',
        "",
        (ToolCall("functions.f:0", "f", '{"a": '),),
    ),
    "kimi_text_between_calls": (
        KIMI,
        _kimi("", ("f", "{}"), end=False) + " note <|tool_calls_section_end|>after",
        " noteafter",
        (ToolCall("functions.f:0", "f", "{}"),),
    ),
    "deepseek_two_calls": (
        DEEPSEEK,
        _deepseek("Checking.\n", ("get_weather", '{"city":"Oslo"}'), ("add", '{"a":1,"b":2}')),
        "Checking.\n",
        (ToolCall("call_0", "get_weather", '{"city":"Oslo"}'), ToolCall("call_1", "add", '{"a":1,"b":2}')),
    ),
    "deepseek_newlines_between_calls": (
        DEEPSEEK,
        "<｜tool▁calls▁begin｜>\n<｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜>\n<｜tool▁calls▁end｜>",
        "",
        (ToolCall("call_0", "f", "{}"),),
    ),
    "deepseek_marker_prefix_at_end": (DEEPSEEK, "text <｜tool▁ca", "text <｜tool▁ca", ()),
    "deepseek_empty_name": (
        DEEPSEEK,
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜> <｜tool▁sep｜>{}",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜> <｜tool▁sep｜>{}",
        (),
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_whole_char_by_char_and_random_splits_agree(case):
    fmt, text, content, calls = case
    whole = parse_tool_calls(text, fmt, _ids())
    assert (whole.content, whole.tool_calls) == (content, calls)
    rng = random.Random(0)
    splits = [list(range(1, len(text)))] + [
        sorted(rng.sample(range(1, len(text)), rng.randint(1, max(1, len(text) // 4)))) for _ in range(30)
    ]
    for cuts in splits:
        streamed_content, deltas = _streamed(text, fmt, cuts)
        assert streamed_content == content
        assert merge_deltas(deltas) == calls
        firsts = [d for d in deltas if d.name]
        assert [d.index for d in firsts] == list(range(len(calls)))  # id and name once, in order
        assert all(not d.id and not d.name for d in deltas if d not in firsts)


def test_markers_are_never_streamed_as_content_while_undecided():
    parser = ToolCallParser(KIMI, _ids())
    assert parser.feed("Hi <|tool_calls_sec") == ("Hi ", [])
    assert parser.feed("tion_begin|><|tool_call_begin|>functions.f:0") == ("", [])
    content, deltas = parser.feed("<|tool_call_argument_begin|>{")
    assert content == "" and deltas[0].name == "f" and "".join(d.arguments for d in deltas) == "{"


@pytest.mark.parametrize("fmt", [KIMI, DEEPSEEK], ids=["kimi", "deepseek"])
def test_random_garbage_never_raises(fmt):
    rng = random.Random(1)
    alphabet = [*fmt.markers, "{", "}", " ", "\n", "a", "<|", "<｜", fmt.markers[1][:5]]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20)))
        whole = parse_tool_calls(text, fmt, _ids())
        cuts = sorted(rng.sample(range(1, len(text)), min(3, max(0, len(text) - 1)))) if len(text) > 1 else []
        content, deltas = _streamed(text, fmt, cuts)
        assert (content, merge_deltas(deltas)) == (whole.content, whole.tool_calls), text


def test_family_prefixes_open_a_call():
    parser = ToolCallParser(KIMI, _ids())
    content, deltas = parser.feed(KIMI.call_prefix("get_weather"))
    assert content == "" and deltas == [deltas[0]] and deltas[0].name == "get_weather"
    parser = ToolCallParser(DEEPSEEK, _ids())
    content, deltas = parser.feed(DEEPSEEK.call_prefix(None) + "f<｜tool▁sep｜>")
    assert content == "" and deltas[0].name == "f" and deltas[0].id == "call_0"


def test_unknown_family_names_tools():
    with pytest.raises(ValueError, match="^tools: "):
        tool_call_format("llama")
