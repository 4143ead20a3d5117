"""Prefix cache for a hybrid model: hash chain, LRU eviction, KDA snapshots, warm equals cold."""

import numpy as np
import pytest
import torch

from common.prefix_hash import chain_root, extend_chain
from services.engine import LLM, SamplingParams
from services.engine.cache.block_pool import BlockPool
from services.engine.cache.layout import block_layout
from services.engine.checkpoint.presets import preset_config
from services.engine.model.config_loader import load_model_config
from tests.conftest import TEST_DEVICE

GREEDY = SamplingParams(max_tokens=6, temperature=0, logprobs=0, ignore_eos=True)
PROMPT = list(range(40, 40 + 50))  # 3 full blocks of 16 before the last token


def bits(values):
    return np.asarray(values, dtype=np.float32).view(np.int32).tolist()


def test_hash_chain_is_salted_and_covers_full_blocks_only():
    root = chain_root("model", tenant="a")
    hashes = extend_chain([], list(range(40)), 16, root)
    assert len(hashes) == 2
    assert extend_chain(hashes[:1], list(range(40)), 16, root) == hashes
    assert extend_chain([], list(range(40)), 16, chain_root("model", tenant="b"))[0] != hashes[0]
    assert extend_chain([], list(range(40)), 16, chain_root("model", adapter="x", tenant="a"))[0] != hashes[0]
    changed = list(range(40))
    changed[20] = 999
    other = extend_chain([], changed, 16, root)
    assert other[0] == hashes[0] and other[1] != hashes[1]


def test_pool_evicts_cached_blocks_in_lru_order():
    config = load_model_config(preset_config("k3", "tiny"))
    pool = BlockPool(block_layout(config, 4, torch.float32), 4, num_blocks=4, device="cpu")
    blocks = pool.allocate(3)
    for block, name in zip(blocks, (b"a", b"b", b"c"), strict=True):
        pool.register(block, name)
    pool.free([blocks[1]])
    pool.free([blocks[0]])
    pool.free([blocks[2]])  # cached, LRU order: b, a, c
    assert pool.lookup(b"a") == 0 and pool.num_free == 4
    pool.acquire([pool.lookup(b"a")])  # a hit takes "a" out of the eviction list
    assert pool.allocate(2) == [3, 1]  # the free block, then the oldest cached one ("b")
    assert pool.lookup(b"b") is None and pool.lookup(b"c") == 2
    pool.check_integrity()
    pool.free([0, 3, 1])
    pool.check_integrity()


@pytest.fixture(scope="module")
def make_llm(tiny_checkpoint):
    def make(family="k3", **options):
        return LLM(
            str(tiny_checkpoint(family)), dtype="float32", device=TEST_DEVICE, block_size=16, **options
        )

    return make


def test_warm_run_reuses_blocks_and_kda_state(make_llm):
    llm = make_llm(max_num_batched_tokens=64)
    cold = llm.generate([PROMPT], GREEDY)[0]
    warm = llm.generate([PROMPT], GREEDY)[0]
    assert cold.num_cached_tokens == 0
    assert warm.num_cached_tokens == 48
    assert warm.token_ids == cold.token_ids
    assert max(abs(a - b) for a, b in zip(warm.logprobs, cold.logprobs, strict=True)) < 1e-4
    llm.engine.check_integrity()


def test_warm_equals_cold_bitwise_in_batch_invariant_mode(make_llm):
    llm = make_llm(batch_invariant=True, max_num_batched_tokens=24)
    cold = llm.generate([PROMPT], GREEDY)[0]
    warm = llm.generate([PROMPT + [7]], SamplingParams(max_tokens=1, temperature=0))[0]
    again = llm.generate([PROMPT], GREEDY)[0]
    assert again.num_cached_tokens == 48 and warm.num_cached_tokens == 48
    assert again.token_ids == cold.token_ids and bits(again.logprobs) == bits(cold.logprobs)
    llm.engine.check_integrity()


def test_match_is_cut_back_to_the_last_snapshot(make_llm):
    llm = make_llm(snapshot_stride=2, max_num_batched_tokens=64)
    # 5 blocks in chunks of 4 + 1: snapshots after 4 (a stride point ending the first chunk) and 5 (its
    # end); the stride point after 2 falls inside the first chunk, which is not cut for it
    long = list(range(40, 120))
    llm.generate([long], GREEDY)
    assert llm.generate([long + [7]], GREEDY)[0].num_cached_tokens == 80  # the prompt-end snapshot
    branch = long[:56] + list(range(300, 320))  # shares 3 blocks, then branches off
    warm = llm.generate([branch], GREEDY)[0]
    assert warm.num_cached_tokens == 0  # 3 cached blocks, but no snapshot at or below them
    sibling = llm.generate([long[:56] + list(range(400, 420))], GREEDY)[0]
    assert sibling.num_cached_tokens == 48  # the branch left a snapshot where it branched off
    llm.engine.check_integrity()


def test_tenants_do_not_share_prefixes(make_llm):
    llm = make_llm()
    llm.generate([PROMPT], GREEDY, tenant="alice")
    assert llm.generate([PROMPT], GREEDY, tenant="bob")[0].num_cached_tokens == 0
    assert llm.generate([PROMPT], GREEDY, tenant="alice")[0].num_cached_tokens == 48


def test_mla_only_model_needs_no_snapshot(make_llm):
    llm = make_llm("deepseek_v32", snapshot_stride=3)
    cold = llm.generate([PROMPT], GREEDY)[0]
    warm = llm.generate([PROMPT], GREEDY)[0]
    assert warm.num_cached_tokens == 48 and warm.token_ids == cold.token_ids


def test_multi_turn_reuses_generated_tokens(make_llm):
    llm = make_llm(max_num_batched_tokens=64)
    first = llm.generate([PROMPT[:30]], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))[0]
    second_turn = PROMPT[:30] + first.token_ids + [5, 6, 7]
    second = llm.generate([second_turn], GREEDY)[0]
    assert second.num_cached_tokens == 48  # blocks filled while decoding, snapshot taken on the way
    cold = make_llm(enable_prefix_caching=False).generate([second_turn], GREEDY)[0]
    assert second.token_ids == cold.token_ids and cold.num_cached_tokens == 0


def test_eviction_under_pressure_keeps_serving(make_llm):
    llm = make_llm(num_blocks=8, max_num_seqs=2, num_snapshots=2)
    prompts = [list(range(start, start + 40)) for start in (100, 300, 500, 700)]
    cold = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    again = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in again] == cold
    llm.engine.check_integrity()
    pool = llm.engine.cache.blocks
    assert all(count == 0 for count in pool.ref_counts)
    assert len(pool.evictable) + len(pool.free_ids) == pool.num_blocks


def test_disabled_prefix_caching_never_hits(make_llm):
    llm = make_llm(enable_prefix_caching=False)
    llm.generate([PROMPT], GREEDY)
    assert llm.generate([PROMPT], GREEDY)[0].num_cached_tokens == 0
    assert not llm.engine.cache.blocks.hash_of
