"""An engine on a node's ``baton cache`` whose tier has a Redis L3 (``--host-cache-address``; the tier
started with ``--redis-url --redis-l3-gib``; a real redis-server): turn 1's pages, written through into
node A's tier and evicted from it to the L3, are brought into node B's fresh tier by the ``Prefetch`` that
an engine on node B starts when turn 2 arrives (``--prefetch-policy wait``), and loaded over that engine's
NIXL agent as tier hits, with the tokens and log-prob bits of a device hit."""

import pytest

from services.engine import LLM
from services.engine.host_rows import SharedRows
from services.hicache.host_tier import KDA, KV
from services.hicache.server import CacheConfig, HostCacheServer
from tests.hicache.test_engine_host_cache import (
    BLOCK,
    DECODES,
    ENGINE_ARGS,
    GREEDY,
    HOST_GIB,
    LOADED,
    NEW_TEXT,
    SMALL_POOL,
    TURN1,
    TURN2_TOKENS,
    bits,
    counted_generate,
)

L3_BYTES = 10 << 20


@pytest.fixture(scope="module")
def nodes(redis_server):
    """Two ``baton cache`` services (in this process) with an L3 in the same Redis: nodes A and B."""
    gib = 1 << 30
    config = CacheConfig(
        int(HOST_GIB * 0.75 * gib),
        int(HOST_GIB * 0.25 * gib),
        port=0,
        redis_url=redis_server.url,
        l3_budget_bytes=L3_BYTES,
        metrics_interval_s=3600,
    )
    servers = HostCacheServer(config), HostCacheServer(config)
    yield servers
    for server in servers:
        server.stop(grace_s=0)


def evict_the_tier(server) -> None:
    """Reserve every page of the service's tier for other hashes (then give them back): each held page
    is evicted, so written back to the L3; wait until the write-back is done."""
    tier = server.servicer.tier
    for kind in tier.kinds:
        junk = [i.to_bytes(32, "little") for i in range(1, tier.arena(kind).num_pages + 1)]
        tier.abort_put(tier.reserve_put(kind, junk).lease_id)
    assert server.servicer.l3.flush()
    assert tier.stats()[KV].pages_used == tier.stats()[KDA].pages_used == 0


def test_an_engine_on_a_fresh_node_tier_loads_turn_one_from_the_l3_bitwise(tiny_checkpoint, nodes):
    node_a, node_b = nodes
    path = str(tiny_checkpoint("k3"))
    first = LLM(path, host_cache_address=f"127.0.0.1:{node_a.port}", **ENGINE_ARGS)  # turn 2: a device hit
    turn1 = first.generate([TURN1], GREEDY, tenant="remote-l3")[0]
    assert node_a.servicer.tier.stats()[KV].pages_used == LOADED // BLOCK  # written through into A
    evict_the_tier(node_a)
    written = node_a.servicer.l3.stats()
    assert written[KV].bytes_written > 0 and written[KDA].bytes_written > 0
    prompt = TURN1 + turn1.token_ids + NEW_TEXT

    fresh = LLM(
        path,
        num_blocks=SMALL_POOL,
        host_cache_address=f"127.0.0.1:{node_b.port}",
        prefetch_policy="wait",
        **ENGINE_ARGS,
    )
    host = fresh.engine.cache.host
    assert isinstance(host.rows, SharedRows) and host.tier.has_l3
    loaded, computed = counted_generate(fresh, prompt, "remote-l3")
    assert loaded.num_cached_tokens == loaded.num_cached_tokens_host == LOADED
    assert computed == TURN2_TOKENS - LOADED + DECODES
    read = node_b.servicer.l3.stats()  # B's Prefetch brought the chain from the L3 into its tier
    assert (read[KV].hits, read[KDA].hits) == (LOADED // BLOCK, 1)
    tier_b = node_b.servicer.tier.stats()
    assert tier_b[KV].bytes_out > 0 and tier_b[KDA].bytes_out > 0  # leased out, read over NIXL
    assert host.rows.transfer_errors == 0 and host.snapshots_restored.total() == 1
    outcomes = fresh.engine.cache.take_prefetch_outcomes()
    assert [o.outcome for o in outcomes] == ["started", "completed"]  # admitted once B answered
    fresh.engine.check_integrity()
    assert node_b.servicer.tier.open_leases() == 0

    device, device_computed = counted_generate(first, prompt, "remote-l3")
    assert device.num_cached_tokens == LOADED and device.num_cached_tokens_host == 0
    assert device_computed == computed
    assert loaded.token_ids == device.token_ids and bits(loaded.logprobs) == bits(device.logprobs)
    first.engine.check_integrity()
