"""IncrementalDetokenizer: held-back split characters, parity with full decode, bounded window."""

from __future__ import annotations

import random

import pytest

from common.tokenizer import IncrementalDetokenizer

REPLACEMENT = "\ufffd"

TEXTS = {
    "emoji": "Launch 🚀🦀 ok 👍🏽 family 👨‍👩‍👧!",
    "cjk": "今天天气很好。𠮷野家 こんにちは 안녕",
    "mixed_code": 'print("🦀 crab")  # 蟹\nreturn 𝔘𝔫𝔦',
}


def _split_points(tokenizer, ids):
    """Indices k where ids[:k] ends inside a character (its bytes continue in later tokens)."""
    return [k for k in range(1, len(ids)) if tokenizer.decode(ids[:k]).endswith(REPLACEMENT)]


def _stream(tokenizer, ids, skip_special_tokens=False):
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
    pieces = [detok.push(i) for i in ids]
    return pieces, detok.flush()


@pytest.mark.parametrize("skip_special_tokens", [False, True], ids=["keep_special", "skip_special"])
@pytest.mark.parametrize("text", TEXTS.values(), ids=TEXTS.keys())
def test_stream_equals_full_decode(tokenizer, text, skip_special_tokens):
    ids = tokenizer.encode(text)
    assert len(_split_points(tokenizer, ids)) >= 3  # hold-back is really exercised
    pieces, rest = _stream(tokenizer, ids, skip_special_tokens)
    assert not any(REPLACEMENT in p for p in pieces)
    assert rest == ""
    assert "".join(pieces) == text == tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def test_split_character_is_held_back_then_emitted_whole(tokenizer):
    crab = tokenizer.encode("🦀")
    assert len(crab) >= 2
    ids = tokenizer.encode("a") + crab + tokenizer.encode("b")
    assert tokenizer.decode(ids) == "a🦀b"
    pieces, rest = _stream(tokenizer, ids)
    assert pieces == ["a"] + [""] * (len(crab) - 1) + ["🦀", "b"]
    assert rest == ""


def test_skipped_special_tokens_inside_split_characters(tokenizer):
    text = TEXTS["emoji"] + TEXTS["cjk"]
    stop, bos = tokenizer.eos_token_ids[0], tokenizer.bos_token_id
    ids = [bos]
    for i in tokenizer.encode(text):
        ids += [i, stop]
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    pieces, rest = _stream(tokenizer, ids, skip_special_tokens=True)
    assert not any(REPLACEMENT in p for p in pieces)
    assert "".join(pieces) + rest == text


def test_kept_special_tokens_between_characters(tokenizer):
    stop = tokenizer.eos_token_ids[0]
    ids = tokenizer.encode("Hi 🦀") + [stop] + tokenizer.encode("你好𠮷") + [stop, stop]
    expected = tokenizer.decode(ids)
    assert expected.count(tokenizer.id_to_token(stop)) == 3
    for skip in (False, True):
        pieces, rest = _stream(tokenizer, ids, skip_special_tokens=skip)
        assert not any(REPLACEMENT in p for p in pieces)
        assert "".join(pieces) + rest == tokenizer.decode(ids, skip_special_tokens=skip)
    pieces, _ = _stream(tokenizer, ids)
    assert pieces[-1] == pieces[-2] == tokenizer.id_to_token(stop)


def test_flush_returns_incomplete_tail(tokenizer):
    ids = tokenizer.encode("ok 🦀")[:-1]
    pieces, rest = _stream(tokenizer, ids)
    # The space shares a token with the crab's first byte, so it is held back with it.
    assert "".join(pieces) == "ok"
    assert rest.startswith(" ") and rest.endswith(REPLACEMENT)
    assert "".join(pieces) + rest == tokenizer.decode(ids)


def test_reusable_after_flush(tokenizer):
    detok = IncrementalDetokenizer(tokenizer)
    for text in ("first 🦀", "second 你好"):
        out = "".join(detok.push(i) for i in tokenizer.encode(text))
        assert out + detok.flush() == text


def test_decode_window_stays_small(tokenizer, monkeypatch):
    text = " ".join(TEXTS.values()) * 40
    ids = tokenizer.encode(text)
    assert len(ids) > 1500
    widths = []
    decode = tokenizer.decode

    def spy(window, skip_special_tokens=False):
        widths.append(len(window))
        return decode(window, skip_special_tokens=skip_special_tokens)

    monkeypatch.setattr(tokenizer, "decode", spy)
    pieces, rest = _stream(tokenizer, ids)
    assert "".join(pieces) + rest == text
    assert len(widths) >= 2 * len(ids)
    assert max(widths) <= 8


@pytest.mark.parametrize("skip_special_tokens", [False, True], ids=["keep_special", "skip_special"])
def test_random_ids_match_full_decode(tokenizer, skip_special_tokens):
    # Random ids include stray continuation bytes and truncated characters: the stream must still
    # equal the full decode, and no push may end in a character that later bytes could complete.
    rng = random.Random(0)
    specials = sorted(tokenizer.special_token_ids)
    for _ in range(300):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randint(1, 24))]
        ids += rng.sample(specials, 2)
        rng.shuffle(ids)
        pieces, rest = _stream(tokenizer, ids, skip_special_tokens)
        assert not any(p.endswith(REPLACEMENT) for p in pieces)
        assert "".join(pieces) + rest == tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
