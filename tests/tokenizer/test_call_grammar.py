"""The grammar of a forced tool call, compiled by llguidance over each family's tokenizer: the tokens of
the call the chat template renders (after the prefilled opening) are accepted to the end, arguments
outside the function's schema or another function's head are refused, and a marker the tokenizer lacks
is an error naming ``chat.tool_choice``."""

import json

import llguidance
import pytest

from common.tool_calls import tool_call_format
from common.tool_calls.call_grammar import forced_call_grammar

SCHEMAS = {
    "get_weather": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "get_time": {},
}


@pytest.fixture
def matcher(model_dir, tokenizer):
    """``matcher(grammar)``: an llguidance matcher of ``grammar`` over the family's tokenizer."""
    lexicon = llguidance.LLTokenizer(
        (model_dir / "tokenizer.json").read_text(),
        n_vocab=tokenizer.vocab_size,
        eos_token=tokenizer.eos_token_ids,
    )
    return lambda grammar: _matcher(lexicon, grammar)


def _matcher(lexicon: llguidance.LLTokenizer, grammar: str) -> llguidance.LLMatcher:
    matcher = llguidance.LLMatcher(lexicon, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher


def _accepts(matcher: llguidance.LLMatcher, ids: list[int]) -> bool:
    return all(matcher.consume_token(t) for t in ids) and not matcher.is_error()


def _rest(fmt, name: str, arguments: dict, head: bool) -> str:
    """What the model writes after the prefilled opening: (head and its end,) arguments, end markers."""
    start = fmt.call_head(name) + fmt.head_end if head else ""
    return start + json.dumps(arguments, separators=(",", ":")) + fmt.call_end + fmt.section_end


def test_a_named_call_is_its_schemas_arguments_then_the_end_markers(tokenizer, family, matcher):
    fmt = tool_call_format(family)
    grammar = forced_call_grammar(fmt, SCHEMAS, "get_weather", tokenizer.token_to_id)
    good = matcher(grammar)
    assert _accepts(good, tokenizer.encode(_rest(fmt, "get_weather", {"city": "Paris"}, head=False)))
    assert good.is_accepting() and good.is_stopped()
    assert not _accepts(matcher(grammar), tokenizer.encode('{"town":"Paris"}'))


def test_required_takes_any_declared_head_with_its_own_arguments(tokenizer, family, matcher):
    fmt = tool_call_format(family)
    grammar = forced_call_grammar(fmt, SCHEMAS, None, tokenizer.token_to_id)
    for name, arguments in (("get_weather", {"city": "Oslo"}), ("get_time", {"tz": "CET"})):
        walk = matcher(grammar)
        assert _accepts(walk, tokenizer.encode(_rest(fmt, name, arguments, head=True)))
        assert walk.is_stopped()
    assert not _accepts(matcher(grammar), tokenizer.encode(fmt.call_head("get_news")))
    assert not _accepts(
        matcher(grammar), tokenizer.encode(_rest(fmt, "get_weather", {"tz": "CET"}, head=True))
    )


def test_a_missing_marker_or_an_undeclared_name_names_the_field(family):
    fmt = tool_call_format(family)
    with pytest.raises(ValueError, match=r"^chat\.tool_choice: the tokenizer has no"):
        forced_call_grammar(fmt, SCHEMAS, "get_weather", lambda marker: None)
    with pytest.raises(ValueError, match=r"^chat\.tool_choice: 'nope' is not a declared tool"):
        forced_call_grammar(fmt, SCHEMAS, "nope", lambda marker: 7)
