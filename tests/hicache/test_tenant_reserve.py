"""Each tenant's reserved share of the host tier (``--tenant-cache-reserve-pages``): on an arena, another
tenant's puts never evict a tenant's pages at or below its reserve (they evict their own, or get no room),
pages beyond the reserve go in LRU order, reserve 0 is plain LRU; the per-tenant counts follow commit,
read, reject and abort and ``check_integrity`` catches a wrong one. The tenant travels from
``HostCacheClient.reserve_put`` over gRPC into the arena, from a request through the engine's
write-through into its own tier, and with a block the device pool evicts. Negative reserves are refused
naming the field or flag."""

import pytest
import torch

from cli.cache_command import config_from
from cli.main import build_parser
from common.prefix_hash import chain_root, extend_chain
from services.engine import LLM, SamplingParams
from services.engine.cache.block_pool import BlockPool
from services.engine.cache.layout import block_layout, slot_layout
from services.engine.cache.state_pool import StateSlotPool
from services.engine.checkpoint.presets import preset_config
from services.engine.host_cache_connector import HostCacheConnector
from services.engine.model.config_loader import load_model_config
from services.hicache.client import HostCacheClient
from services.hicache.host_tier import KDA, KV, HostTier
from services.hicache.page_arena import PageArena
from services.hicache.server import CacheConfig, HostCacheServer
from tests.conftest import TEST_DEVICE

PAGE = 16
KV_PAGE, KDA_PAGE = 256, 512


def arena(pages: int, reserve: int) -> PageArena:
    return PageArena(KV, PAGE, pages * PAGE, pin=False, tenant_reserve=reserve)


def put(arena: PageArena, tenant: str, *names: str) -> tuple[list[str], int]:
    """One put of ``names`` for ``tenant``, committed; returns the hashes it evicted and its no-room count."""
    hashes = [name.encode() for name in names]
    pages, evicted, no_room = arena.reserve(hashes, tenant)
    given = [h for h, page in zip(hashes, pages, strict=True) if page is not None]
    arena.commit(given, [0] * len(given))
    arena.check_integrity()
    return [page.block_hash.decode() for page in evicted], no_room


def fill(arena: PageArena) -> None:
    """acme's a0 a1 a2, then beta's b0 b1 b2, one put each: that LRU order, oldest first."""
    for tenant, names in (("acme", ("a0", "a1", "a2")), ("beta", ("b0", "b1", "b2"))):
        for name in names:
            assert put(arena, tenant, name) == ([], 0)


def test_another_tenant_never_evicts_a_tenant_at_its_reserve():
    pages = arena(pages=6, reserve=2)
    fill(pages)
    assert pages.held_by == {"acme": 3, "beta": 3}
    assert put(pages, "beta", "b3") == (["a0"], 0)  # acme's oldest: beyond its reserve, plain LRU
    assert put(pages, "beta", "b4") == (["b0"], 0)  # acme is at its reserve: beta evicts its own
    assert put(pages, "beta", "b5", "b6") == (["b1", "b2"], 0)
    assert pages.held_by == {"acme": 2, "beta": 4}
    assert pages.holds(b"a1") and pages.holds(b"a2")
    assert put(pages, "acme", "a3") == (["a1"], 0)  # a tenant's own puts evict its own pages


def test_a_put_that_finds_only_other_tenants_reserves_gets_no_room():
    pages = arena(pages=4, reserve=2)
    for tenant, names in (("acme", ("a0", "a1")), ("", ("n0", "n1"))):  # "": a tenant like any other
        put(pages, tenant, *names)
    assert put(pages, "beta", "b0", "b1") == ([], 2)
    assert pages.evictions == 0 and pages.held_by == {"acme": 2, "": 2}
    assert put(pages, "", "n2") == (["n1"], 0)  # the anonymous tenant evicts its own (n1: the tail)


def test_without_a_reserve_eviction_is_plain_lru():
    pages = arena(pages=6, reserve=0)
    fill(pages)
    assert put(pages, "beta", "b3") == (["a0"], 0)
    assert put(pages, "beta", "b4", "b5") == (["a1", "a2"], 0)
    assert pages.held_by == {"beta": 6}


def test_counts_follow_reads_rejects_and_aborts_and_a_wrong_count_is_caught():
    pages = arena(pages=4, reserve=1)
    put(pages, "acme", "a0", "a1")  # LRU: a1 (the tail), a0
    put(pages, "beta", "b0")
    _, sums = pages.acquire([b"a0"])
    assert pages.held_by == {"acme": 2, "beta": 1}  # a page being read still counts
    reserved, _, _ = pages.reserve([b"c0"], "gamma")
    pages.abort([b"c0"])  # never committed: never counted
    assert None not in reserved and pages.held_by == {"acme": 2, "beta": 1}
    # acme holds 2 with its read page, above its reserve: its held a1 goes; beta's b0 is its reserve.
    assert put(pages, "gamma", "c0", "c1") == (["a1"], 0)
    assert pages.reject([b"a0"], sums[0])  # dropped as corrupt (released first)
    assert pages.held_by == {"beta": 1, "gamma": 2}
    pages.check_integrity()
    pages.held_by["beta"] += 1
    with pytest.raises(AssertionError, match="committed pages by tenant"):
        pages.check_integrity()


def test_the_kda_arena_keeps_one_snapshot_per_stride_of_reserved_pages():
    def tier(**reserve):
        return HostTier(KV_PAGE, KDA_PAGE, 8 * KV_PAGE, 4 * KDA_PAGE, "fp", pin=False, **reserve)

    assert (tier().kv.tenant_reserve, tier().kda.tenant_reserve) == (0, 0)
    plain = tier(tenant_reserve_pages=5)  # a `baton cache`: not told a stride
    assert (plain.kv.tenant_reserve, plain.kda.tenant_reserve) == (5, 5)
    strided = tier(tenant_reserve_pages=5, snapshot_stride=2)
    assert (strided.kv.tenant_reserve, strided.kda.tenant_reserve) == (5, 3)
    with pytest.raises(ValueError, match="snapshot_stride: must be >= 1, got 0"):
        tier(tenant_reserve_pages=5, snapshot_stride=0)


def test_a_negative_reserve_is_refused_naming_the_field_or_flag():
    message = "tenant_cache_reserve_pages: must be >= 0, got -1"
    with pytest.raises(ValueError, match=message):
        arena(pages=4, reserve=-1)
    with pytest.raises(ValueError, match=message):
        HostTier(KV_PAGE, 0, 4 * KV_PAGE, 0, "fp", pin=False, tenant_reserve_pages=-1)
    with pytest.raises(ValueError, match=rf"{message} \(--tenant-cache-reserve-pages\)"):
        CacheConfig(KV_PAGE, 0, tenant_cache_reserve_pages=-1).validate()
    args = build_parser().parse_args(["cache", "--kv-gib", "1", "--tenant-cache-reserve-pages", "-1"])
    with pytest.raises(ValueError, match="--tenant-cache-reserve-pages: must be >= 0"):
        config_from(args)
    args = build_parser().parse_args(["cache", "--kv-gib", "1", "--tenant-cache-reserve-pages", "3"])
    assert config_from(args).tenant_cache_reserve_pages == 3


def test_the_tenant_travels_from_the_client_over_grpc_into_the_arena():
    config = CacheConfig(
        4 * KV_PAGE, 2 * KDA_PAGE, port=0, metrics_interval_s=3600, tenant_cache_reserve_pages=2
    )
    server = HostCacheServer(config)
    client = HostCacheClient(f"127.0.0.1:{server.port}")
    chains = {t: extend_chain([], list(range(8)), 4, chain_root("model", tenant=t)) for t in ("acme", "beta")}
    try:
        client.attach("layout-tenants", KV_PAGE, KDA_PAGE)
        tier = server.servicer.tier
        assert (tier.kv.tenant_reserve, tier.kda.tenant_reserve) == (2, 2)
        for tenant, hashes in chains.items():
            client.commit_put(client.reserve_put(KV, hashes, tenant=tenant).lease_id)
        client.commit_put(client.reserve_put(KDA, chains["acme"][-1:], tenant="acme").lease_id)
        assert tier.kv.held_by == {"acme": 2, "beta": 2} and tier.kda.held_by == {"acme": 1}
        other = extend_chain([], list(range(4)), 4, chain_root("model", tenant="gamma"))
        lease = client.reserve_put(KV, other, tenant="gamma")  # every page is another tenant's reserve
        assert (lease.pages, lease.no_room) == ((None,), 1)
        lease = client.reserve_put(KV, other)  # no tenant: the anonymous one's, no room either
        assert lease.no_room == 1 and tier.kv.evictions == 0
        tier.check_integrity()
    finally:
        client.close()
        server.stop(grace_s=0)


def test_an_engines_own_tier_holds_each_requests_pages_as_its_tenants(tiny_checkpoint):
    llm = LLM(
        str(tiny_checkpoint("k3")),
        dtype="float32",
        device=TEST_DEVICE,
        block_size=8,
        max_num_batched_tokens=64,
        max_model_len=128,
        max_num_seqs=2,
        host_cache_gib=0.01,
        tenant_cache_reserve_blocks=4,
    )
    tier = llm.engine.cache.host.tier
    assert (tier.kv.tenant_reserve, tier.kda.tenant_reserve) == (4, 4)  # the default stride 1
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    llm.generate([list(range(40, 64))], params, tenant="acme")  # 3 full blocks written through
    llm.generate([list(range(100, 116))], params)  # 2, the anonymous tenant's
    assert tier.kv.held_by == {"acme": 3, "": 2}
    assert set(tier.kda.held_by) == {"acme", ""}  # the prompt-end snapshots, each its tenant's
    llm.engine.check_integrity()


def test_device_evictions_offload_each_block_as_its_tenants_page():
    """Blocks evicted from the device pool (not written through before) land in the tier as their own
    tenants' pages: one put per tenant of the allocation."""
    config = load_model_config(preset_config("k3", "tiny"))
    blocks = BlockPool(block_layout(config, 4, torch.float32), 4, num_blocks=3, device="cpu")
    slots = StateSlotPool(slot_layout(config, torch.float32), 1, device="cpu")
    connector = HostCacheConnector.in_process(blocks, slots, gib=0.01, kda_fraction=0.5)
    blocks.on_evict = connector.offload
    ids = blocks.allocate(3)
    for block, name, tenant in zip(ids, (b"a", b"b", b"c"), ("acme", "beta", "acme"), strict=True):
        blocks.register(block, name, tenant)
    blocks.free(ids)
    blocks.allocate(3, tenant="gamma")  # evicts a, b, c
    assert connector.tier.kv.held_by == {"acme": 2, "beta": 1}
    connector.check_integrity()
