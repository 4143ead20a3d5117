"""Tokenizer.from_pretrained: missing and malformed files, config variants."""

from __future__ import annotations

import json
import shutil

import pytest

from common.tokenizer import Tokenizer, TokenizerNotFoundError


@pytest.fixture
def copy_dir(build_dir, tmp_path):
    """A writable copy of the tiny deepseek_v32 tokenizer folder."""
    out = tmp_path / "model"
    shutil.copytree(build_dir("deepseek_v32"), out)
    return out


def _edit_json(path, **changes):
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update(changes)
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


def test_missing_folder(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(TokenizerNotFoundError, match=r"no tokenizer") as info:
        Tokenizer.from_pretrained(missing)
    assert isinstance(info.value, FileNotFoundError)
    assert str(missing / "tokenizer.json") in str(info.value)


def test_folder_without_tokenizer_json(copy_dir):
    (copy_dir / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json: not found; the folder has no tokenizer"):
        Tokenizer.from_pretrained(copy_dir)


def test_malformed_tokenizer_json(copy_dir):
    (copy_dir / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": 3}}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"tokenizer\.json: malformed tokenizer file"):
        Tokenizer.from_pretrained(copy_dir)


@pytest.mark.parametrize("name", ["tokenizer_config.json", "generation_config.json"])
def test_malformed_json_config(copy_dir, name):
    (copy_dir / name).write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{name.replace('.', '[.]')}: malformed JSON"):
        Tokenizer.from_pretrained(copy_dir)


def test_malformed_chat_template(copy_dir):
    _edit_json(copy_dir / "tokenizer_config.json", chat_template="{% for m in messages %}{{ m.content }}")
    with pytest.raises(ValueError, match=r"tokenizer_config\.json: chat template: line 1: "):
        Tokenizer.from_pretrained(copy_dir)


def test_eos_id_out_of_range(copy_dir):
    _edit_json(copy_dir / "generation_config.json", eos_token_id=[1, 10**6])
    with pytest.raises(ValueError, match=r"generation_config\.json: eos_token_id: expected ids below 512"):
        Tokenizer.from_pretrained(copy_dir)


def test_single_int_eos_id(copy_dir):
    _edit_json(copy_dir / "generation_config.json", eos_token_id=7)
    assert Tokenizer.from_pretrained(copy_dir).eos_token_ids == [7]


def test_eos_falls_back_to_config_token(copy_dir):
    (copy_dir / "generation_config.json").unlink()
    tok = Tokenizer.from_pretrained(copy_dir)
    assert tok.eos_token_ids == [tok.token_to_id("<｜end▁of▁sentence｜>")]


def test_added_token_dict_form(copy_dir):
    # DeepSeek's released configs store named tokens as serialized AddedToken dicts.
    bos = {"__type": "AddedToken", "content": "<｜begin▁of▁sentence｜>", "lstrip": False, "normalized": True}
    _edit_json(copy_dir / "tokenizer_config.json", bos_token=bos)
    tok = Tokenizer.from_pretrained(copy_dir)
    assert tok.bos_token_id == tok.token_to_id(bos["content"])
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]).startswith(
        bos["content"] + "<｜User｜>"
    )


def test_named_token_missing_from_vocabulary(copy_dir):
    _edit_json(copy_dir / "tokenizer_config.json", eos_token="<not-a-token>")
    with pytest.raises(
        ValueError, match=r"tokenizer_config\.json: eos_token '<not-a-token>' is not in the vocabulary"
    ):
        Tokenizer.from_pretrained(copy_dir)


def test_tokenizer_json_alone_is_enough(copy_dir):
    (copy_dir / "tokenizer_config.json").unlink()
    (copy_dir / "generation_config.json").unlink()
    tok = Tokenizer.from_pretrained(str(copy_dir))
    assert tok.bos_token_id is None
    assert tok.eos_token_ids == []
    assert tok.decode(tok.encode("hello 🦀")) == "hello 🦀"
