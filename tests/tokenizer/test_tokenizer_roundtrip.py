"""Tokenizer.encode / decode: lossless round trips, parity with transformers, vocabulary lookups."""

from __future__ import annotations

import pytest

TEXTS = {
    "ascii": "The quick brown fox jumps over the lazy dog. 1 + 2 = 3!",
    "cjk": "今天天气很好。こんにちは、世界。안녕하세요.",
    "emoji": "launch 🚀🦀 done 👍🏽 family 👨‍👩‍👧",
    "code": 'def f(x: int) -> int:\n\treturn x ** 2  # square\n\nprint(f"{f(3)=}")\n',
    "whitespace": "  leading and trailing  \n\n\t mixed\r\n",
    "rare_script": "ᚠᛇᚻ ∮ E⋅da = Q 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
}


@pytest.mark.parametrize("text", TEXTS.values(), ids=TEXTS.keys())
def test_round_trip(tokenizer, hf_tokenizer, text):
    ids = tokenizer.encode(text)
    assert ids and all(0 <= i < tokenizer.vocab_size for i in ids)
    assert tokenizer.decode(ids) == text
    assert hf_tokenizer(text, add_special_tokens=False)["input_ids"] == ids


def test_multibyte_characters_split_across_tokens(tokenizer):
    # The byte-level model must split rare characters into several byte tokens; the detokenizer
    # tests rely on this.
    ids = tokenizer.encode("🦀")
    assert len(ids) > 1
    assert "\ufffd" in tokenizer.decode(ids[:1])


def test_special_tokens_in_text_and_skipping(tokenizer):
    bos, stop = tokenizer.bos_token_id, tokenizer.eos_token_ids[0]
    text = f"{tokenizer.id_to_token(bos)}hi there{tokenizer.id_to_token(stop)}"
    ids = tokenizer.encode(text)
    assert ids[0] == bos and ids[-1] == stop
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids, skip_special_tokens=True) == "hi there"


def test_add_special_tokens_prepends_bos(tokenizer):
    assert tokenizer.encode("hi", add_special_tokens=True) == [
        tokenizer.bos_token_id,
        *tokenizer.encode("hi"),
    ]


def test_vocabulary_lookups(tokenizer):
    ids = tokenizer.encode("hello world")
    tokens = [tokenizer.id_to_token(i) for i in ids]
    assert [tokenizer.token_to_id(t) for t in tokens] == ids
    assert tokenizer.id_to_token(tokenizer.vocab_size) is None
    assert tokenizer.token_to_id("<definitely not a token>") is None
