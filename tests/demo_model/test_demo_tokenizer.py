"""The demo tokenizer: built from the training split, round-trips held-out text, renders chats as
transformers does, and rebuilds byte-identically."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import transformers

from common.tokenizer import Tokenizer, write_tokenizer
from common.tokenizer.family import get_family
from tools.demo_model import corpus
from tools.demo_model.build_tokenizer import DEMO_VOCAB_SIZE, build_demo_tokenizer, main

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")

CHATS = {
    "user_only": [{"role": "user", "content": "Who made the heavens and the earth?"}],
    "system_and_multi_turn": [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "What did God call the light?"},
        {"role": "assistant", "content": "He called the light Day."},
        {"role": "user", "content": 'And the darkness? Answer "briefly" -- 2 words, é 你好.'},
    ],
    "assistant_last": [
        {"role": "user", "content": "Say amen."},
        {"role": "assistant", "content": "Amen."},
    ],
}


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo_tokenizer")
    assert main([str(out)]) == 0  # the build command itself, on the whole training split
    return out


@pytest.fixture(scope="module")
def tokenizer(demo_dir) -> Tokenizer:
    return Tokenizer.from_pretrained(demo_dir)


@pytest.fixture(scope="module")
def hf_tokenizer(demo_dir):
    return transformers.AutoTokenizer.from_pretrained(str(demo_dir))


def test_vocabulary_is_full_with_kimi_specials_on_top(tokenizer, demo_dir):
    spec = get_family("k3")
    assert tokenizer.vocab_size == DEMO_VOCAB_SIZE
    special_ids = [tokenizer.token_to_id(t) for t in spec.special_tokens]
    assert special_ids == list(range(DEMO_VOCAB_SIZE - len(special_ids), DEMO_VOCAB_SIZE))
    assert tokenizer.eos_token_ids == [tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("[EOS]")]
    generation = json.loads((demo_dir / "generation_config.json").read_text(encoding="utf-8"))
    assert generation["eos_token_id"] == tokenizer.eos_token_ids
    # Trained on English: common words are single tokens.
    for word in (" the", " and", " said", " earth", " light"):
        assert len(tokenizer.encode(word)) == 1, word


def test_heldout_documents_round_trip(tokenizer, hf_tokenizer):
    documents = list(corpus.heldout_documents())
    assert len(documents) >= 10
    encoded_bytes = 0
    for document in documents:
        ids = tokenizer.encode(document)
        assert tokenizer.decode(ids) == document
        assert hf_tokenizer.encode(document, add_special_tokens=False) == ids
        encoded_bytes += len(document.encode("utf-8"))
        # English compresses: well over 3 bytes per token on unseen chapters.
        assert len(document.encode("utf-8")) / len(ids) > 3.0
    assert encoded_bytes > 20_000


@pytest.mark.parametrize("add_generation_prompt", [True, False], ids=["gen_prompt", "no_gen_prompt"])
@pytest.mark.parametrize("chat", CHATS.values(), ids=CHATS.keys())
def test_chat_template_matches_transformers(tokenizer, hf_tokenizer, chat, add_generation_prompt):
    expected = hf_tokenizer.apply_chat_template(
        chat, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    rendered = tokenizer.apply_chat_template(chat, add_generation_prompt=add_generation_prompt)
    assert rendered == expected
    assert rendered.count("<|im_end|>") == len(chat) + (chat[0]["role"] != "system")
    expected_ids = hf_tokenizer.apply_chat_template(
        chat, add_generation_prompt=add_generation_prompt, tokenize=True
    )["input_ids"]
    ids = tokenizer.encode_chat(chat, add_generation_prompt=add_generation_prompt)
    assert ids == expected_ids
    assert tokenizer.decode(ids) == rendered
    assert ids.count(tokenizer.token_to_id("<|im_middle|>")) == rendered.count("<|im_middle|>")


def test_rebuild_is_byte_identical_and_reads_the_training_split_in_order(tmp_path):
    first, second, direct = tmp_path / "first", tmp_path / "second", tmp_path / "direct"
    build_demo_tokenizer(first, vocab_size=1024, max_documents=40)
    build_demo_tokenizer(second, vocab_size=1024, max_documents=40)
    write_tokenizer(direct, "k3", 1024, itertools.islice(corpus.train_documents(), 40))
    for name in TOKENIZER_FILES:
        content = (first / name).read_bytes()
        assert content == (second / name).read_bytes(), name
        assert content == (direct / name).read_bytes(), name
    assert Tokenizer.from_pretrained(first).vocab_size == 1024


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-documents", "0"], "max_documents: 0 must be at least 1"),
        (["--vocab-size", "100"], "vocab_size: 100 is too small"),
    ],
    ids=["no_documents", "vocab_too_small"],
)
def test_bad_arguments_are_named(tmp_path, capsys, args, message):
    assert main([str(tmp_path / "out"), *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out" / "tokenizer.json").exists()


def test_missing_corpus_package_is_a_clear_error(tmp_path, capsys, monkeypatch):
    absent = corpus.CorpusSource("no-such-corpus-package", "1.0", "no_such", "", "", "")
    monkeypatch.setattr(corpus, "SOURCES", (absent,))
    assert main([str(tmp_path / "out")]) == 2
    assert "no-such-corpus-package: not installed" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_shipped_models_carry_this_build(demo_dir):
    """models/k3-demo and its draft were trained with exactly what `build_tokenizer` makes."""
    models = Path(__file__).resolve().parents[2] / "models"
    for folder in ("k3-demo", "k3-demo-draft"):
        for name in ("tokenizer.json", "tokenizer_config.json"):
            assert (models / folder / name).read_bytes() == (demo_dir / name).read_bytes(), (folder, name)
