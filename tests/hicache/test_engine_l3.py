"""The engine's own tier with a Redis L3 below it (``--host-cache-gib --redis-l3-gib --redis-url``, a real
redis-server): turn 1's pages, evicted from one engine's tier, are written back to the L3; another engine
with a fresh tier prefetches them when turn 2 arrives (``--prefetch-policy wait``) and loads them as tier
hits, with the tokens and log-prob bits of a device hit. With Redis down, the request still completes."""

import pytest

from deploy.local.redis_server import free_port
from services.engine import LLM
from services.hicache.host_tier import KDA, KV
from tests.hicache.test_engine_host_cache import (
    DECODES,
    ENGINE_ARGS,
    GREEDY,
    HOST_GIB,
    LOADED,
    SMALL_POOL,
    TURN1,
    TURN2_TOKENS,
    bits,
    counted_generate,
)

L3_GIB = 0.01


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return str(tiny_checkpoint("k3"))


def evict_the_tier(llm) -> None:
    """Reserve every page of the engine's tier for other hashes (then give them back): each held page
    is evicted, so written back to the L3; wait until the write-back is done."""
    host = llm.engine.cache.host
    for kind in host.tier.kinds:
        junk = [i.to_bytes(32, "little") for i in range(1, host.tier.arena(kind).num_pages + 1)]
        host.tier.abort_put(host.tier.reserve_put(kind, junk).lease_id)
    assert host.prefetcher.flush()
    assert host.tier.stats()[KV].pages_used == 0


def test_a_fresh_tier_prefetches_evicted_pages_from_l3_and_loads_them_bitwise(checkpoint, redis_server):
    tier = dict(host_cache_gib=HOST_GIB, redis_l3_gib=L3_GIB, redis_url=redis_server.url)
    first = LLM(checkpoint, **tier, **ENGINE_ARGS)  # a large pool: turn 2 hits it on the device
    turn1 = first.generate([TURN1], GREEDY, tenant="l3")[0]
    evict_the_tier(first)
    l3 = first.engine.cache.host.prefetcher.stats()
    assert l3[KV].bytes_written > 0 and l3[KDA].bytes_written > 0
    prompt = TURN1 + turn1.token_ids + list(range(500, 510))

    fresh = LLM(checkpoint, num_blocks=SMALL_POOL, prefetch_policy="wait", **tier, **ENGINE_ARGS)
    loaded, computed = counted_generate(fresh, prompt, "l3")
    assert loaded.num_cached_tokens == loaded.num_cached_tokens_host == LOADED
    assert computed == TURN2_TOKENS - LOADED + DECODES
    stats = fresh.engine.cache.host.prefetcher.stats()
    assert (stats[KV].hits, stats[KDA].hits) == (LOADED // ENGINE_ARGS["block_size"], 1)
    outcomes = fresh.engine.cache.take_prefetch_outcomes()
    assert [o.outcome for o in outcomes] == ["started", "completed"]  # "wait": admitted once it was done
    fresh.engine.check_integrity()

    device, device_computed = counted_generate(first, prompt, "l3")
    assert device.num_cached_tokens == LOADED and device.num_cached_tokens_host == 0
    assert device_computed == computed
    assert loaded.token_ids == device.token_ids and bits(loaded.logprobs) == bits(device.logprobs)
    first.engine.check_integrity()


def test_redis_down_costs_only_misses(checkpoint):
    down = f"redis://127.0.0.1:{free_port()}"
    llm = LLM(checkpoint, host_cache_gib=HOST_GIB, redis_l3_gib=L3_GIB, redis_url=down, **ENGINE_ARGS)
    llm.engine.cache.prefetch_gate.policy = "wait"  # even waiting for it: the failed prefetch is over
    (output,) = llm.generate([TURN1], GREEDY, tenant="down")
    assert output.num_cached_tokens == 0 and len(output.token_ids) == GREEDY.max_tokens
    assert llm.engine.cache.host.prefetcher.stats()[KV].misses == len(TURN1) // ENGINE_ARGS["block_size"]
    assert [o.outcome for o in llm.engine.cache.take_prefetch_outcomes()] == ["started", "completed"]
    llm.engine.check_integrity()
