"""The router's prefix index over the engine's own SHA-256 chain: hashes agree with what an engine
registers (model, tenant, block size), matches count whole held blocks, updates insert and evict."""

import pytest

from router.prefix_index import ChainSalt, PrefixIndex, PromptHashes
from services.engine import LLM, SamplingParams

PROMPT = list(range(40, 40 + 50))  # 3 full blocks of 16
SALT = ChainSalt("model", 16)


@pytest.fixture(scope="module")
def llm(tiny_checkpoint):
    return LLM(str(tiny_checkpoint("k3")), dtype="float32", device="cpu", block_size=16)


def test_the_routers_hashes_are_the_blocks_an_engine_registers(llm):
    llm.generate([PROMPT], SamplingParams(max_tokens=1, ignore_eos=True), tenant="alice")
    blocks = llm.engine.cache.blocks
    salt = ChainSalt(llm.engine.model_fingerprint, blocks.block_size)
    hashes = PromptHashes(PROMPT, "alice").under(salt)
    assert len(hashes) == 3 and all(blocks.lookup(h) is not None for h in hashes)
    assert all(blocks.lookup(h) is None for h in PromptHashes(PROMPT, "bob").under(salt))
    other_size = PromptHashes(PROMPT, "alice").under(ChainSalt(salt.model_fingerprint, 8))
    assert all(blocks.lookup(h) is None for h in other_size)
    # A LoRA-adapted request's blocks are salted by the adapter's digest: the router matches none.
    assert PromptHashes(PROMPT, "alice", adapter="tuned").under(salt) == []


def test_a_match_counts_leading_held_blocks_in_tokens():
    index, prompt = PrefixIndex(), PromptHashes(PROMPT, "")
    hashes = prompt.under(SALT)
    assert index.match_tokens("w", hashes) == 0  # never heard of
    index.reset("w", SALT, [hashes[0], hashes[2]])
    assert index.match_tokens("w", hashes) == 16  # the chain stops at the first missing block
    index.apply("w", inserted=[hashes[1]], evicted=[])
    assert index.match_tokens("w", hashes) == 48
    index.apply("w", inserted=[], evicted=[hashes[0]])
    assert index.match_tokens("w", hashes) == 0


def test_a_worker_without_prefix_caching_or_forgotten_matches_nothing():
    index, hashes = PrefixIndex(), PromptHashes(PROMPT, "").under(SALT)
    index.reset("w", None, hashes)
    assert index.salt("w") is None and index.match_tokens("w", hashes) == 0
    index.reset("w", SALT, hashes)
    index.forget("w")
    index.apply("w", inserted=hashes, evicted=[])  # an update with no full picture before it
    assert index.match_tokens("w", hashes) == 0


def test_prompt_hashes_are_computed_once_per_salt():
    prompt = PromptHashes(PROMPT, "t")
    assert prompt.under(SALT) is prompt.under(ChainSalt("model", 16))
    assert len(prompt.under(ChainSalt("model", 32))) == 1
