"""write_tiny_tokenizer: vocabulary bounds, special tokens, stop ids, determinism, errors."""

from __future__ import annotations

import json

import pytest

from common.tokenizer import Tokenizer, write_tiny_tokenizer
from common.tokenizer.family import get_family

EXPECTED_STOPS = {
    "k3": ["<|im_end|>", "[EOS]"],
    "kimi_linear": ["<|im_end|>", "[EOS]"],
    "deepseek_v32": ["<｜end▁of▁sentence｜>"],
}


@pytest.mark.parametrize("vocab_size", [400, 512, 1024], ids=lambda v: f"vocab{v}")
def test_every_id_is_below_vocab_size(build_dir, family, vocab_size):
    model_dir = build_dir(family, vocab_size)
    data = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    ids = list(data["model"]["vocab"].values()) + [t["id"] for t in data["added_tokens"]]
    assert len(ids) == len(set(ids))
    assert max(ids) < vocab_size
    tok = Tokenizer.from_pretrained(model_dir)
    assert tok.vocab_size == len(ids) <= vocab_size
    # The merges actually used the budget: far more than the 256 byte tokens plus specials.
    assert tok.vocab_size > 256 + len(get_family(family).special_tokens) + 64


def test_special_tokens_encode_to_one_id(tokenizer, family):
    spec = get_family(family)
    ids = []
    for token in spec.special_tokens:
        encoded = tokenizer.encode(f"a{token}b")
        assert len(encoded) == 3, token
        ids.append(encoded[1])
        assert tokenizer.token_to_id(token) == encoded[1]
        assert tokenizer.decode([encoded[1]]) == token
        assert tokenizer.decode([encoded[1]], skip_special_tokens=True) == ""
    assert all(i < tokenizer.vocab_size for i in ids)
    assert tokenizer.special_token_ids == set(ids)
    # Specials sit at the top of the vocabulary, after the byte alphabet and the merges.
    assert ids == list(range(tokenizer.vocab_size - len(ids), tokenizer.vocab_size))


def test_stop_and_bos_ids(model_dir, tokenizer, family):
    spec = get_family(family)
    stops = [tokenizer.token_to_id(t) for t in EXPECTED_STOPS[family]]
    assert tokenizer.eos_token_ids == stops
    assert tokenizer.bos_token_id == tokenizer.token_to_id(spec.bos_token)
    generation = json.loads((model_dir / "generation_config.json").read_text(encoding="utf-8"))
    assert generation == {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": stops,
        "pad_token_id": tokenizer.token_to_id(spec.pad_token),
    }
    config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["eos_token"] == spec.eos_token
    assert {int(i): t["content"] for i, t in config["added_tokens_decoder"].items()} == {
        tokenizer.token_to_id(t): t for t in spec.special_tokens
    }


def test_training_is_deterministic(tmp_path):
    for name in ("a", "b"):
        write_tiny_tokenizer(tmp_path / name, "deepseek_v32", 700)
    for file in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes(), file


def test_common_words_become_single_tokens(tokenizer):
    for word in (" the", " and", " return", " self", " assistant"):
        assert len(tokenizer.encode(word)) == 1, word
    # Rare characters stay split into byte-level pieces.
    assert len(tokenizer.encode("🦀")) > 1


def test_hf_loads_the_same_vocabulary(tokenizer, hf_tokenizer):
    assert len(hf_tokenizer) == tokenizer.vocab_size
    text = "Hello world! def f(x): return x * 2 你好 🦀"
    assert hf_tokenizer(text, add_special_tokens=True)["input_ids"] == tokenizer.encode(
        text, add_special_tokens=True
    )
    assert tokenizer.encode(text, add_special_tokens=True)[0] == tokenizer.bos_token_id
    assert set(hf_tokenizer.all_special_ids) == tokenizer.special_token_ids


@pytest.mark.parametrize("family", ["kimi_linear", "deepseek_v32"])
def test_vocab_size_too_small(tmp_path, family):
    with pytest.raises(ValueError, match=r"vocab_size: 300 is too small"):
        write_tiny_tokenizer(tmp_path, family, 300)
    assert not (tmp_path / "tokenizer.json").exists()


def test_unknown_family(tmp_path):
    with pytest.raises(ValueError, match=r"family: unknown tokenizer family 'llama'"):
        write_tiny_tokenizer(tmp_path, "llama", 512)
