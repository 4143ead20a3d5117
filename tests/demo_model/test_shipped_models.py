"""The trained demo model and its draft shipped in ``models/`` (issue 17): intact, of the K3 family,
and decoding the same fixed continuation on any CPU (batch-invariant numerics: our own reduction order)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from common.tokenizer import Tokenizer
from services.engine import LLM, SamplingParams
from services.engine.model.config_loader import load_model_config

MODELS = Path(__file__).resolve().parents[2] / "models"
TARGET, DRAFT = MODELS / "k3-demo", MODELS / "k3-demo-draft"
# The checksums file itself: changing a shipped file means re-pinning this on purpose.
SHA256SUMS_DIGEST = "e791458362fd0a5884a94504c8f7a0ba03c3ddb302547cd11f245fdf7b300b1c"
PROMPT = "And God said, Let there be light:"
GREEDY_IDS = [318, 258, 442, 327, 258, 408, 268, 388, 11, 266, 258, 388, 268, 258, 452, 327]
GREEDY_TEXT = " for the day is the man of God, and the God of the Lord is"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_shipped_file_matches_its_checksum():
    sums = MODELS / "SHA256SUMS"
    assert _sha256(sums) == SHA256SUMS_DIGEST
    listed = {}
    for line in sums.read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        listed[name] = digest
    shipped = {str(p.relative_to(MODELS)) for folder in (TARGET, DRAFT) for p in folder.iterdir()}
    assert set(listed) == shipped
    for name, digest in listed.items():
        assert _sha256(MODELS / name) == digest, name


def test_sizes_fit_the_repository_budget():
    files = [p for folder in (TARGET, DRAFT) for p in folder.iterdir()]
    assert sum(p.stat().st_size for p in files) < 40 * 2**20
    assert all(p.stat().st_size <= 16 * 2**20 for p in files if p.suffix == ".safetensors")


def test_both_are_k3_models_with_every_code_path_and_one_tokenizer():
    target, draft = load_model_config(TARGET), load_model_config(DRAFT)
    for config in (target, draft):
        assert config.family == "k3", config.family
        assert config.kda is not None and config.indexer is not None  # KDA, and MLA with the DSA indexer
        assert config.moe is not None and config.moe.num_shared_experts == 1
    assert target.vocab_size == draft.vocab_size == Tokenizer.from_pretrained(TARGET).vocab_size
    assert (TARGET / "tokenizer.json").read_bytes() == (DRAFT / "tokenizer.json").read_bytes()


@pytest.fixture(scope="module")
def greedy() -> SamplingParams:
    return SamplingParams(max_tokens=len(GREEDY_IDS), temperature=0)


def test_target_greedy_decodes_the_fixed_continuation(greedy):
    llm = LLM(str(TARGET), batch_invariant=True, dtype="float32", max_num_seqs=1, max_model_len=128)
    out = llm.generate([PROMPT], greedy)[0]
    assert out.token_ids == GREEDY_IDS
    assert out.text == GREEDY_TEXT


def test_speculating_with_the_shipped_draft_gives_the_same_tokens(greedy):
    llm = LLM(
        str(TARGET),
        batch_invariant=True,
        dtype="float32",
        max_num_seqs=1,
        max_model_len=128,
        draft_model=str(DRAFT),
        num_draft_tokens=3,
        spec_policy="fixed",
    )
    out = llm.generate([PROMPT], greedy)[0]
    assert out.token_ids == GREEDY_IDS
    counts = llm.engine.spec_counters.counts()
    assert counts.verifies > 0 and sum(counts.accepted_by_position) > 0  # the draft ran and was right
