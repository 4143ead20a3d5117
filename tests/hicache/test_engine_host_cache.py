"""The engine with its own host tier (``--host-cache-gib``): a later turn whose prefix the device pool
lost loads it from the tier instead of recomputing, with the same tokens and log-prob bits; a corrupt
page and a tier full of pinned pages cost only recomputation, with the bits of a run without the tier.

Each family builds two engines, reused across cases by tenant (the salt keeps their chains apart):
one with an 8-block device pool and a tier, one with a large pool and no tier. Turn 1 leaves the device
pool by a filler request's pressure (k3) or, cheaper, by taking every free block once (the others)."""

import hashlib

import numpy as np
import pytest
import torch

from services.engine import LLM, SamplingParams
from services.engine.cache.block_pool import BlockPool
from services.engine.cache.layout import block_layout, slot_layout
from services.engine.cache.snapshot_policy import SnapshotPolicy
from services.engine.cache.state_pool import StateSlotPool
from services.engine.cache_counters import CHECKSUM, TO_HOST
from services.engine.checkpoint.presets import preset_config
from services.engine.engine_config import EngineConfig
from services.engine.host_cache_connector import HostCacheConnector
from services.engine.model.config_loader import load_model_config
from services.engine.request import Request
from services.hicache.host_tier import KV
from tests.conftest import TEST_DEVICE

BLOCK = 8
GREEDY = SamplingParams(max_tokens=3, temperature=0, logprobs=0, ignore_eos=True)
TURN1 = list(range(40, 66))  # 26 tokens: 3 full blocks
FILLER = list(range(200, 260))  # 60 other tokens: push turn 1's blocks out of an 8-block pool
NEW_TEXT = list(range(500, 510))
SMALL_POOL = 8
HOST_GIB = 0.01
TURN2_TOKENS = len(TURN1) + GREEDY.max_tokens + len(NEW_TEXT)
DECODES = GREEDY.max_tokens - 1
LOADED = 3 * BLOCK  # turn 1's full blocks, with the KDA snapshot after them (its last chunk ends there)


def bits(values):
    return np.asarray(values, dtype=np.float32).view(np.int32).tolist()


ENGINE_ARGS = dict(  # every engine of these tests: a small float32 model, batches of 64 tokens
    dtype="float32",
    device=TEST_DEVICE,
    block_size=BLOCK,
    max_num_batched_tokens=64,
    max_model_len=128,
    max_num_seqs=2,
)


@pytest.fixture(scope="module")
def engines(tiny_checkpoint):
    """``engines(family, batch_invariant=False) -> (with tier and a small pool, without tier)``, cached."""
    made = {}

    def make(family, batch_invariant=False):
        if (family, batch_invariant) not in made:
            common = dict(ENGINE_ARGS, batch_invariant=batch_invariant)
            path = str(tiny_checkpoint(family))
            tier = LLM(path, num_blocks=SMALL_POOL, host_cache_gib=HOST_GIB, **common)
            plain = LLM(path, **common) if not batch_invariant else None
            made[family, batch_invariant] = tier, plain
        return made[family, batch_invariant]

    return make


def counted_generate(llm, prompt, tenant):
    """``generate`` one prompt; returns (output, tokens run through the model for it)."""
    scheduler = llm.engine.scheduler
    schedule, ran = scheduler.schedule, []

    def counting(*args):
        output = schedule(*args)
        ran.append(output.num_tokens)
        return output

    scheduler.schedule = counting
    try:
        (output,) = llm.generate([prompt], GREEDY, tenant=tenant)
    finally:
        scheduler.schedule = schedule
    return output, sum(ran)


def turn_one(llm, tenant, evict="take"):
    """Turn 1, then its blocks evicted from the device pool (``filler``: by another request, ``take``:
    by allocating every free block once, ``None``: kept); returns turn 2's prompt."""
    first = llm.generate([TURN1], GREEDY, tenant=tenant)[0]
    if evict == "filler":
        llm.generate([FILLER], GREEDY, tenant=tenant)
    elif evict == "take":
        blocks = llm.engine.cache.blocks
        blocks.free(blocks.allocate(blocks.num_free))
    assert evict is None or not any(blocks_of(llm, TURN1, tenant))
    return TURN1 + first.token_ids + NEW_TEXT


def blocks_of(llm, prompt, tenant):
    """The device blocks registered under the prompt's full blocks (None where not held)."""
    return [llm.engine.cache.blocks.lookup(h) for h in blocks_hashes(llm, prompt, tenant)]


def blocks_hashes(llm, prompt, tenant):
    """The salted hash chain of ``prompt``'s full blocks under ``tenant``."""
    return llm.engine.cache._hashes(llm.engine._new_request(prompt, GREEDY, None, tenant, ""))


@pytest.mark.parametrize(
    "family, evict", [("k3", "filler"), ("kimi_linear", "take"), ("deepseek_v32", "take")]
)
def test_turn_two_loads_its_prefix_from_the_host_tier(engines, family, evict):
    tier, plain = engines(family)
    loaded, computed = counted_generate(tier, turn_one(tier, "load", evict), "load")
    assert loaded.num_cached_tokens == loaded.num_cached_tokens_host == LOADED
    assert computed == TURN2_TOKENS - LOADED + DECODES
    assert tier.engine.cache.host.tier.stats()[KV].bytes_out > 0
    tier.engine.check_integrity()  # pools and tier: nothing held, no lease open
    # A pool that kept turn 1 hits the same prefix on the device: the same steps, so the same bits.
    device, device_computed = counted_generate(plain, turn_one(plain, "device", evict=None), "device")
    assert device.num_cached_tokens == LOADED and device.num_cached_tokens_host == 0
    assert device_computed == computed
    assert loaded.token_ids == device.token_ids and bits(loaded.logprobs) == bits(device.logprobs)
    # Without a tier (--host-cache-gib 0) nothing changes: recomputing turn 2 gives the same tokens.
    assert plain.engine.cache.host is None and plain.engine.cache.blocks.on_evict is None
    cold, cold_computed = counted_generate(plain, loaded.prompt_ids, "cold")
    assert cold.num_cached_tokens == 0 and cold_computed == TURN2_TOKENS + DECODES
    assert loaded.token_ids == cold.token_ids
    plain.engine.check_integrity()


def test_batch_invariant_load_equals_recompute_bitwise(engines):
    tier, _ = engines("k3", batch_invariant=True)
    loaded, _ = counted_generate(tier, turn_one(tier, "load"), "load")
    cold, _ = counted_generate(tier, loaded.prompt_ids, "cold")
    assert loaded.num_cached_tokens_host == LOADED and cold.num_cached_tokens == 0
    assert loaded.token_ids == cold.token_ids and bits(loaded.logprobs) == bits(cold.logprobs)
    tier.engine.check_integrity()


def test_a_corrupt_page_is_recomputed(engines):
    tier, plain = engines("k3")
    prompt = turn_one(tier, "corrupt")
    host = tier.engine.cache.host.tier
    failures = host.stats()[KV].checksum_failures
    cache = tier.engine.cache
    fallbacks = cache.counts().load_fallbacks[CHECKSUM]
    block_hash = blocks_hashes(tier, TURN1, "corrupt")[1]
    host.kv.storage[_page_of(host, block_hash), 0] ^= 0xFF  # turn 1's second block, flipped in host memory
    second, computed = counted_generate(tier, prompt, "corrupt")
    assert second.num_cached_tokens == second.num_cached_tokens_host == 0
    assert computed == TURN2_TOKENS + DECODES
    assert host.stats()[KV].checksum_failures == failures + 1
    assert cache.counts().load_fallbacks[CHECKSUM] == fallbacks + 1  # the worker's view of it
    cold, _ = counted_generate(plain, prompt, "cold-corrupt")
    assert second.token_ids == cold.token_ids and bits(second.logprobs) == bits(cold.logprobs)
    tier.engine.check_integrity()


def _page_of(tier, block_hash):
    lease = tier.begin_get(KV, [block_hash])
    tier.end_get(lease.lease_id)
    (page,) = lease.pages
    return page


def _pools():
    config = load_model_config(preset_config("k3", "tiny"))
    blocks = BlockPool(block_layout(config, 4, torch.float32), 4, num_blocks=3, device="cpu")
    slots = StateSlotPool(slot_layout(config, torch.float32), 1, device="cpu")
    return blocks, slots


def test_device_eviction_offloads_a_block_the_tier_lacks_once():
    blocks, slots = _pools()
    connector = HostCacheConnector.in_process(blocks, slots, gib=0.01, kda_fraction=0.5)
    blocks.on_evict = connector.offload
    ids = blocks.allocate(3)
    for block, name in zip(ids, (b"a", b"b", b"c"), strict=True):
        blocks.storage[block] = block + 1
        blocks.register(block, name)
    connector.save_blocks([b"a"], [ids[0]])  # written through already: not offloaded again
    blocks.free(ids)
    puts = []
    reserve_put = connector.tier.reserve_put
    connector.tier.reserve_put = lambda kind, hashes, tenant: (
        puts.append(list(hashes)) or reserve_put(kind, hashes, tenant)
    )
    blocks.allocate(3)  # evicts a, b, c
    assert puts == [[b"a", b"b", b"c"]]  # one put for the allocation (a round trip each to a remote tier)
    assert connector.counters.offloads == 2
    assert connector.counters.moved_bytes[KV, TO_HOST] == 3 * blocks.layout.nbytes  # a (saved), b, c
    assert connector.match([b"a"]).kv_depth == 1
    lease = connector.tier.begin_get(KV, [b"b", b"c"])
    assert [int(connector.tier.kv.storage[p][0]) for p in lease.pages] == [ids[1] + 1, ids[2] + 1]
    connector.tier.end_get(lease.lease_id)
    connector.check_integrity()


def test_host_cache_flags_are_checked_naming_the_flag():
    with pytest.raises(ValueError, match=r"host_cache_gib: .*parallel engine"):
        EngineConfig(model="m", host_cache_gib=1, tp=2)
    with pytest.raises(ValueError, match=r"host_cache_gib: .*--prefix-caching"):
        EngineConfig(model="m", host_cache_gib=1, enable_prefix_caching=False)
    with pytest.raises(ValueError, match=r"host_cache_address: .*give one of them"):
        EngineConfig(model="m", host_cache_gib=1, host_cache_address="h:1")
    with pytest.raises(ValueError, match=r"host_cache_kda_fraction: must be in \(0, 1\)"):
        EngineConfig(model="m", host_cache_kda_fraction=1.0)
    with pytest.raises(ValueError, match=r"host_cache_gib: must be a finite number >= 0"):
        EngineConfig(model="m", host_cache_gib=-1)
    blocks, slots = _pools()
    with pytest.raises(ValueError, match=r"host_cache_gib: 1e-09 GiB .* holds no page"):
        HostCacheConnector.in_process(blocks, slots, gib=1e-9, kda_fraction=0.25)


def test_snapshot_points():
    policy = SnapshotPolicy(block_tokens=4, stride=4)
    request = Request("r", list(range(30)), SamplingParams(), frozenset(), branch_tokens=8)
    assert [(p, policy.reason(request, p)) for p in (4, 8, 16, 28, 30)] == [
        (4, None),
        (8, "branch"),
        (16, "stride"),
        (28, "prompt_end"),
        (30, None),
    ]
    request.output_ids = [1, 2, 3, 4, 5, 6]
    assert policy.reason(request, 36) == "decode"
    # one cut per chunk: the branch point when crossed, else the chunk's last stride / prompt-end point
    assert [policy.cut_point(request, s, 30, 8) for s in (0, 8, 16, 28)] == [8, 28, 28, None]
    assert policy.cut_point(request, 8, 20, 8) == 16  # the last stride point inside
    assert policy.cut_point(request, 17, 20, 8) is None  # no point inside: run it whole
    assert policy.cut_point(request, 8, 16, 8) is None  # it ends on one: no cut either


def _pin_every_page(tier):
    """Fill each arena of ``tier`` with pages of another chain and lease them all to a reader; returns the
    leases (nothing can be evicted, so the tier has no room)."""
    leases = []
    for kind in tier.kinds:
        arena = tier.arena(kind)
        hashes = [hashlib.sha256(f"pinned-{kind}-{i}".encode()).digest() for i in range(arena.num_pages)]
        put = tier.reserve_put(kind, hashes)
        assert None not in put.pages
        tier.commit_put(put.lease_id)
        leases.append(tier.begin_get(kind, hashes))
        assert len(leases[-1].pages) == arena.num_pages
    return leases


def test_a_tier_full_of_pinned_pages_skips_saves_and_misses_without_failing(engines):
    tier, plain = engines("k3")
    host = tier.engine.cache.host
    leases = _pin_every_page(host.tier)
    saved, offloaded = host.snapshots_saved.total(), host.counters.offloads
    try:
        prompt = turn_one(tier, "pinned", "take")  # turn 1's saves, then its eviction's offloads: skipped
        assert host.match(blocks_hashes(tier, TURN1, "pinned")).kv_depth == 0
        assert (host.snapshots_saved.total(), host.counters.offloads) == (saved, offloaded)
        second, computed = counted_generate(tier, prompt, "pinned")  # evicted, not in the tier: recomputed
        assert second.num_cached_tokens == second.num_cached_tokens_host == 0
        assert computed == TURN2_TOKENS + DECODES
    finally:
        for lease in leases:
            host.tier.end_get(lease.lease_id)
    cold, _ = counted_generate(plain, prompt, "cold-pinned")
    assert second.token_ids == cold.token_ids and bits(second.logprobs) == bits(cold.logprobs)
    tier.engine.check_integrity()
