"""Each tenant's reserved share of the prefix cache (``--tenant-cache-reserve-blocks``): on the block
pool, another tenant's allocations skip a tenant's cached blocks at its reserve and ``can_allocate``
does not count them, while its own allocations may evict them; through ``LLM``, a flood of another
tenant's prompts leaves a tenant's prompt cached (a prefix hit next time), where without the reserve
it is evicted, for a KV-only model (DeepSeek-V3.2) and a hybrid one (k3), whose hit also needs the KDA
state snapshot: the snapshot store keeps each tenant's reserve the same way (one snapshot per snapshot
stride of reserved blocks)."""

import pytest
import torch

from services.engine import LLM, SamplingParams
from services.engine.cache.block_pool import BlockPool
from services.engine.cache.layout import block_layout, slot_layout
from services.engine.cache.snapshot_store import SnapshotStore
from services.engine.checkpoint.presets import preset_config
from services.engine.engine_config import EngineConfig
from services.engine.model.config_loader import load_model_config
from tests.conftest import TEST_DEVICE


def _pool(num_blocks: int, reserve: int) -> BlockPool:
    config = load_model_config(preset_config("k3", "tiny"))
    return BlockPool(block_layout(config, 4, torch.float32), 4, num_blocks, "cpu", tenant_reserve=reserve)


def _cache(pool: BlockPool, tenant: str, names: list[bytes]) -> list[int]:
    """Blocks of ``tenant`` holding ``names``, then freed: cached, in that LRU order."""
    blocks = pool.allocate(len(names), tenant=tenant)
    for block, name in zip(blocks, names, strict=True):
        pool.register(block, name, tenant)
    pool.free(blocks)
    return blocks


def test_another_tenant_never_evicts_a_tenant_below_its_reserve():
    pool = _pool(num_blocks=6, reserve=2)
    _cache(pool, "acme", [b"a1", b"a2", b"a3"])  # oldest
    _cache(pool, "beta", [b"b1", b"b2", b"b3"])
    assert pool.cached_by == {"acme": 3, "beta": 3} and pool.num_free == 6
    assert pool.can_allocate(2, tenant="beta") and not pool.can_allocate(5, tenant="beta")
    assert pool.can_allocate(4, tenant="beta")  # its own 3 and acme's one above the reserve
    taken = pool.allocate(4, tenant="beta")
    assert pool.lookup(b"a1") is None  # acme's oldest, above its reserve
    assert pool.lookup(b"a2") is not None and pool.lookup(b"a3") is not None  # acme's reserve
    assert all(pool.lookup(name) is None for name in (b"b1", b"b2", b"b3"))
    assert not pool.can_allocate(1, tenant="beta")
    assert pool.can_allocate(2, tenant="acme")  # acme may evict its own
    pool.check_integrity()
    pool.free(taken)
    pool.check_integrity()


def test_without_a_reserve_eviction_is_plain_lru():
    pool = _pool(num_blocks=4, reserve=0)
    _cache(pool, "acme", [b"a1", b"a2"])
    _cache(pool, "beta", [b"b1", b"b2"])
    pool.allocate(3, tenant="beta")
    assert [pool.lookup(name) is not None for name in (b"a1", b"a2", b"b1", b"b2")] == [
        False,
        False,
        False,
        True,
    ]
    pool.check_integrity()


def test_a_bad_reserve_names_the_field():
    with pytest.raises(ValueError, match="tenant_cache_reserve_blocks: must be an integer >= 0"):
        EngineConfig(model="m", tenant_cache_reserve_blocks=-1)


def _store(num_snapshots: int, reserve: int) -> SnapshotStore:
    config = load_model_config(preset_config("k3", "tiny"))
    return SnapshotStore(slot_layout(config, torch.float32), num_snapshots, "cpu", tenant_reserve=reserve)


def test_the_snapshot_store_keeps_each_tenants_reserve():
    store = _store(num_snapshots=4, reserve=1)
    row = torch.zeros_like(store.pool.storage[0])
    for name, tenant in ((b"a1", "acme"), (b"a2", "acme"), (b"b1", "beta"), (b"b2", "beta")):
        assert store.save(name, row, tenant) is not None
    assert store.save(b"b3", row, "beta") is not None  # evicts acme's oldest (acme above its reserve)
    assert store.lookup(b"a1") is None and store.lookup(b"a2") is not None
    assert store.save(b"b4", row, "beta") is not None  # beta's own oldest now, not acme's last one
    assert store.lookup(b"b1") is None and store.lookup(b"a2") is not None
    assert store.kept_by == {"acme": 1, "beta": 3}
    store.check_integrity()
    full = _store(num_snapshots=2, reserve=1)
    full.save(b"a1", row, "acme")
    full.save(b"c1", row, "carol")
    assert full.save(b"b1", row, "beta") is None  # every snapshot is another tenant's reserve
    assert full.lookup(b"b1") is None and full.kept_by == {"acme": 1, "carol": 1}
    assert full.save(b"a2", row, "acme") is not None and full.lookup(b"a1") is None  # its own
    full.check_integrity()
    plain = _store(num_snapshots=2, reserve=0)
    for name, tenant in ((b"a1", "acme"), (b"b1", "beta"), (b"b2", "beta")):
        plain.save(name, row, tenant)
    assert plain.lookup(b"a1") is None  # no reserve: plain LRU
    plain.check_integrity()


@pytest.mark.parametrize("family", ["deepseek_v32", "k3"])
@pytest.mark.parametrize(("reserve", "kept"), [(0, False), (4, True)], ids=["no-reserve", "reserve"])
def test_a_flood_of_another_tenant_leaves_a_tenant_its_cached_prompt(tiny_checkpoint, family, reserve, kept):
    llm = LLM(
        str(tiny_checkpoint(family)),
        dtype="float32",
        device=TEST_DEVICE,
        block_size=16,
        num_blocks=12,
        max_num_seqs=2,
        max_num_batched_tokens=64,
        tenant_cache_reserve_blocks=reserve,
    )
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    prompt = list(range(3, 3 + 48))  # three full blocks
    llm.generate([prompt], params, tenant="acme")
    for seed in range(6):  # beta's prompts: three blocks each, more than the pool can keep
        llm.generate([[(7 * seed + i) % 500 + 600 for i in range(48)]], params, tenant="beta")
    # acme's next turn extends its prompt: a hit of all three blocks (a KDA model: and of the snapshot
    # taken where the first turn's prompt ended).
    again = llm.generate([prompt + list(range(700, 708))], params, tenant="acme")[0]
    assert again.num_cached_tokens == (48 if kept else 0), again.num_cached_tokens
    llm.engine.check_integrity()
