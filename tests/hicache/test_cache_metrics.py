"""The worker's prefix-cache metrics through an engine with its own host tier (tiny k3): a prefix loaded
from the tier counts host tokens and bytes to the device, the same prefix hit again counts device tokens;
the tier's hits and misses count once per admitted request, however many passes it waited; the
counters reach ``/metrics`` as ``baton_prefix_cache_*`` and ``baton_hicache_*``."""

import pytest

from common.metrics import Metrics
from services.engine import LLM, SamplingParams
from services.engine.cache_counters import DEVICE, HOST, L3, TO_DEVICE, TO_HOST
from services.hicache.host_tier import KDA, KV
from tests.hicache.test_engine_host_cache import ENGINE_ARGS, LOADED, TURN1

GREEDY = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_checkpoint):
    """A k3 engine with an 8-block device pool and a 10 MiB tier in its process."""
    return LLM(str(tiny_checkpoint("k3")), num_blocks=8, host_cache_gib=0.01, **ENGINE_ARGS)


def delta(after: dict, before: dict) -> dict:
    return {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0)}


def evict_device_pool(llm):
    blocks = llm.engine.cache.blocks
    blocks.free(blocks.allocate(blocks.num_free))


def test_a_tier_hit_counts_host_tokens_and_a_second_request_counts_device(llm):
    cache = llm.engine.cache
    kv_bytes, kda_bytes = cache.blocks.layout.nbytes, cache.slots.layout.nbytes
    start = cache.counts()
    first = llm.generate([TURN1], GREEDY, tenant="hits")[0]
    written = cache.counts()
    assert delta(written.hit_tokens, start.hit_tokens) == {}  # a cold prompt: nothing cached
    assert written.moved_bytes[KV, TO_HOST] - start.moved_bytes[KV, TO_HOST] == 3 * kv_bytes  # write-through
    assert written.moved_bytes[KDA, TO_HOST] > start.moved_bytes[KDA, TO_HOST]  # its snapshots
    evict_device_pool(llm)  # turn 1 survives only in the tier

    prompt = TURN1 + first.token_ids + list(range(500, 510))
    loaded = llm.generate([prompt], GREEDY, tenant="hits")[0]
    after_load = cache.counts()
    assert loaded.num_cached_tokens_host == LOADED
    assert delta(after_load.hit_tokens, written.hit_tokens) == {(HOST, KV): LOADED, (HOST, KDA): LOADED}
    moved = delta(after_load.moved_bytes, written.moved_bytes)
    assert (moved[KV, TO_DEVICE], moved[KDA, TO_DEVICE]) == (3 * kv_bytes, kda_bytes)

    again = llm.generate([prompt], GREEDY, tenant="hits")[0]  # its prefix is on the device now
    after_again = cache.counts()
    assert again.num_cached_tokens > 0 and again.num_cached_tokens_host == 0
    hits = delta(after_again.hit_tokens, after_load.hit_tokens)
    assert hits == {(DEVICE, KV): again.num_cached_tokens, (DEVICE, KDA): again.num_cached_tokens}
    assert after_again.hit_tokens[L3, KV] == after_again.hit_tokens[L3, KDA] == 0
    assert after_again.tier_up is True and after_again.load_fallbacks == start.load_fallbacks
    llm.engine.check_integrity()

    metrics = Metrics("prefill")
    metrics.observe_prefix_cache(after_again, ())
    text = scrape(metrics)
    total_host_kv = after_again.hit_tokens[HOST, KV]
    assert f'baton_prefix_cache_hit_tokens_total{{kind="kv",tier="host"}} {float(total_host_kv)}' in text
    assert 'baton_prefix_cache_hit_tokens_total{kind="kv",tier="l3"} 0.0' in text
    to_device = float(after_again.moved_bytes[KV, TO_DEVICE])
    assert f'baton_hicache_moved_bytes_total{{direction="to_device",kind="kv"}} {to_device}' in text
    assert 'baton_hicache_tier_up{role="prefill"} 1.0' in text
    capacity = float(cache.host.tier.kv.num_pages)  # the in-process tier's own gauges, from the worker
    assert f'baton_hicache_pages_capacity{{kind="kv"}} {capacity}' in text


def test_tier_hits_and_misses_count_once_per_admitted_request(llm):
    """B waits (A holds 7 of the 8 device blocks) and is matched on every pass meanwhile; the tier counts
    the chain of each admission once (the chain asked of the tier: 6 blocks for A's 50 tokens, 2 for
    B's 20, and a re-admission's after a preemption)."""
    cache = llm.engine.cache
    tier = cache.host.tier
    evict_device_pool(llm)
    before = tier.stats()
    find_prefix, admit, matched, admitted = cache.find_prefix, cache.admit, [], []

    def matching(request):
        matched.append(request.request_id)
        return find_prefix(request)

    def admitting(request, hit, new_tokens):
        admitted.append(hit.tier_blocks)
        return admit(request, hit, new_tokens)

    cache.find_prefix, cache.admit = matching, admitting
    try:
        a, b = list(range(600, 650)), list(range(700, 720))
        llm.generate([a, b], GREEDY, tenant="waits")
    finally:
        del cache.find_prefix, cache.admit
    after = tier.stats()
    assert admitted[:1] == [6] and 2 in admitted
    assert len(matched) > len(admitted), f"B did not wait: matched {matched}"
    kv = (after[KV].hits - before[KV].hits) + (after[KV].misses - before[KV].misses)
    kda = (after[KDA].hits - before[KDA].hits) + (after[KDA].misses - before[KDA].misses)
    assert (kv, kda) == (sum(admitted), len(admitted))
    llm.engine.check_integrity()


def scrape(metrics: Metrics) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry).decode()
