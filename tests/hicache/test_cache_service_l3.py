"""``baton cache --redis-url --redis-l3-gib`` (the service in this process, a real redis-server): pages its
tier evicts go to the L3; another node's tier, asked by a worker's ``Prefetch``, brings them back bitwise
and answers ``Match`` with them; a tier without an L3 answers a prefetch at once; the L3 metrics move."""

import threading

import torch

from common.prefix_hash import chain_root, extend_chain
from services.hicache.client import HostCacheClient
from services.hicache.host_tier import KDA, KV
from services.hicache.server import CacheConfig, HostCacheServer

KV_PAGE, KDA_PAGE = 256, 512
KV_PAGES, KDA_PAGES = 4, 2
FINGERPRINT = "layout-l3"


def start(redis_url: str = "", l3_bytes: int = 0) -> HostCacheServer:
    config = CacheConfig(
        KV_PAGES * KV_PAGE,
        KDA_PAGES * KDA_PAGE,
        port=0,
        redis_url=redis_url,
        l3_budget_bytes=l3_bytes,
        metrics_interval_s=3600,
    )
    return HostCacheServer(config)


def write(tier, kind: str, hashes: list[bytes], rows: torch.Tensor) -> None:
    """A worker's put, its rows copied straight into the in-process service's pages."""
    lease = tier.reserve_put(kind, hashes)
    for page, row in zip(lease.pages, rows, strict=True):
        tier.arena(kind).storage[page].copy_(row)
    tier.commit_put(lease.lease_id)


def test_a_prefetch_brings_another_tiers_evicted_pages_back_bitwise(redis_server):
    hashes = extend_chain([], list(range(12)), 4, chain_root("model", tenant="t"))  # 3 blocks
    kv_rows = torch.randint(
        0, 256, (3, KV_PAGE), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)
    )
    kda_row = torch.randint(
        0, 256, (1, KDA_PAGE), dtype=torch.uint8, generator=torch.Generator().manual_seed(2)
    )
    node_a, node_b = start(redis_server.url, 1 << 20), start(redis_server.url, 1 << 20)
    plain = start()
    clients = [HostCacheClient(f"127.0.0.1:{server.port}") for server in (node_a, node_b, plain)]
    try:
        for client in clients:
            client.attach(FINGERPRINT, KV_PAGE, KDA_PAGE)
        assert [client.has_l3 for client in clients] == [True, True, False]
        tier_a = node_a.servicer.tier
        write(tier_a, KV, hashes, kv_rows)
        write(tier_a, KDA, hashes[-1:], kda_row)
        others = extend_chain([], list(range(100, 116)), 4, chain_root("model", tenant="other"))
        write(tier_a, KV, others, torch.zeros(4, KV_PAGE, dtype=torch.uint8))  # evicts the 3 blocks
        write(tier_a, KDA, others[:2], torch.zeros(2, KDA_PAGE, dtype=torch.uint8))  # and the snapshot
        assert node_a.servicer.l3.flush()
        assert clients[0].match(hashes, has_state=True).kv_depth == 0

        prefetch = clients[1].prefetch(hashes, has_state=True, tenant="t")
        while not prefetch.done():
            threading.Event().wait(0.01)
        assert prefetch.pages() == (3, 1)
        tier_b = node_b.servicer.tier
        assert (tier_b.kv.held_by, tier_b.kda.held_by) == ({"t": 3}, {"t": 1})  # in the tenant's reserve
        match = clients[1].match(hashes, has_state=True)
        assert (match.kv_depth, match.usable_depth) == (3, 3)
        lease = tier_b.begin_get(KV, hashes)
        assert torch.equal(tier_b.kv.storage[list(lease.pages)], kv_rows)
        tier_b.end_get(lease.lease_id)
        lease = tier_b.begin_get(KDA, hashes[-1:])
        assert torch.equal(tier_b.kda.storage[lease.pages[0]], kda_row[0])
        tier_b.end_get(lease.lease_id)

        node_b.metrics.observe_l3(node_b.servicer.l3.stats())
        node_a.metrics.observe_l3(node_a.servicer.l3.stats())
        sample = lambda server, name, **labels: server.metrics.registry.get_sample_value(name, labels)  # noqa: E731
        assert sample(node_b, "baton_hicache_l3_hits_total", kind=KV) == 3
        assert sample(node_b, "baton_hicache_l3_bytes_total", kind=KDA, direction="read") == KDA_PAGE
        assert sample(node_a, "baton_hicache_l3_bytes_total", kind=KV, direction="write") == 3 * KV_PAGE

        nothing = clients[2].prefetch(hashes, has_state=True)  # no L3 there: over at once, no call made
        assert nothing.done() and nothing.pages() == (0, 0)
        for server in (node_a, node_b):
            server.servicer.tier.check_integrity()
            assert server.servicer.tier.open_leases() == 0
    finally:
        for client in clients:
            client.close()
        for server in (node_a, node_b, plain):
            server.stop()
