"""Shared fixtures: tiny tokenizer folders for every family, built once per session."""

from __future__ import annotations

import pathlib

import pytest
import transformers

from common.tokenizer import Tokenizer, write_tiny_tokenizer

FAMILIES = ("k3", "kimi_linear", "deepseek_v32")
VOCAB_SIZE = 512


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory):
    """Return a function (family, vocab_size) -> folder holding that tiny tokenizer (cached)."""
    built: dict[tuple[str, int], pathlib.Path] = {}

    def build(family: str, vocab_size: int = VOCAB_SIZE) -> pathlib.Path:
        key = (family, vocab_size)
        if key not in built:
            out = tmp_path_factory.mktemp(f"{family}_{vocab_size}")
            write_tiny_tokenizer(out, family, vocab_size)
            built[key] = out
        return built[key]

    return build


@pytest.fixture(scope="session", params=FAMILIES)
def family(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def model_dir(build_dir, family) -> pathlib.Path:
    return build_dir(family)


@pytest.fixture(scope="session")
def tokenizer(model_dir) -> Tokenizer:
    return Tokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="session")
def hf_tokenizer(model_dir):
    return transformers.AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="session")
def kimi_tokenizer(build_dir) -> Tokenizer:
    return Tokenizer.from_pretrained(build_dir("kimi_linear"))
