"""The engine with a separate ``baton cache`` tier (``--host-cache-address``) keeping its pages private
(``--shm-dir ''``): turn 2 loads its prefix over this engine's NIXL agent from the tier's regions, with
the log-prob bits of a device hit; a tier killed mid-way (between the lease and the read, then for good)
only costs misses: every request still completes, with the bits of a full recompute, and nothing is left
leased or allocated; restarted on its port, the tier is attached again and the engine's agent reconnects
to its new run. A tier holding another layout (the FP8 KV format's) refuses the engine, which serves
without it; a corrupt page in the tier is dropped, recomputed and counted in
``baton_hicache_checksum_failures_total``."""

import logging
import time
import urllib.request

import pytest

from deploy.local.launcher import ManagedCache
from deploy.local.supervisor import Supervisor
from services.engine import LLM
from services.engine.cache_counters import MOVE_FAILED
from services.engine.host_rows import SharedRows
from services.hicache.host_tier import KDA, KV
from services.hicache.server import CacheConfig, HostCacheServer
from tests.hicache.test_engine_host_cache import (
    DECODES,
    ENGINE_ARGS,
    HOST_GIB,
    LOADED,
    SMALL_POOL,
    TURN1,
    TURN2_TOKENS,
    _page_of,
    bits,
    blocks_hashes,
    counted_generate,
    turn_one,
)


@pytest.fixture(scope="module")
def cache():
    """``baton cache`` in its own process, as ``baton serve --host-cache-gib`` starts it, keeping its pages
    private: every row moves over NIXL (``test_engine_shared_tier.py``: mapped on the same machine)."""
    yield from started_cache(shm_dir="")


@pytest.fixture(scope="module")
def engines(tiny_checkpoint, cache):
    return tier_engines(tiny_checkpoint, cache)


def started_cache(shm_dir: str):
    """A started ``ManagedCache`` of ``HOST_GIB`` with its pages in ``shm_dir``, stopped after use."""
    cache = ManagedCache(kv_gib=HOST_GIB * 0.75, kda_gib=HOST_GIB * 0.25, shm_dir=shm_dir)
    cache.start(ready_timeout_s=120)
    yield cache
    cache.stop()


def tier_engines(tiny_checkpoint, cache):
    """(k3 with the ``baton cache`` ``cache`` and a small device pool, k3 with a large pool and no tier)."""
    path = str(tiny_checkpoint("k3"))
    with_tier = LLM(path, num_blocks=SMALL_POOL, host_cache_address=cache.address, **ENGINE_ARGS)
    return with_tier, LLM(path, **ENGINE_ARGS)


def test_turn_two_loads_its_prefix_from_the_remote_tier(engines):
    remote, plain = engines
    host = remote.engine.cache.host
    assert isinstance(host.rows, SharedRows) and host.rows.mapped_epoch == 0  # nothing mapped: NIXL moves
    loaded, computed = counted_generate(remote, turn_one(remote, "load", "filler"), "load")
    assert loaded.num_cached_tokens == loaded.num_cached_tokens_host == LOADED
    assert computed == TURN2_TOKENS - LOADED + DECODES
    stats = host.tier.stats()
    assert stats[KV].bytes_out > 0 and stats[KDA].bytes_out > 0  # pages leased out and read over NIXL
    assert host.snapshots_restored.total() == 1 and host.rows.transfer_errors == 0
    remote.engine.check_integrity()  # pools, and no lease left open
    device, device_computed = counted_generate(plain, turn_one(plain, "device", evict=None), "device")
    assert device.num_cached_tokens == LOADED and device_computed == computed
    assert loaded.token_ids == device.token_ids and bits(loaded.logprobs) == bits(device.logprobs)


def test_a_tier_killed_mid_way_costs_only_misses(engines, cache):
    """It kills the tier (the next test has the supervisor start it again)."""
    remote, plain = engines
    host = remote.engine.cache.host
    prompt = turn_one(remote, "killed", "filler")
    lease = host.lease

    def lease_then_kill(*args, **kwargs):  # the tier dies after leasing the pages, before they are read
        leases = lease(*args, **kwargs)
        cache.process.kill()
        cache.process.wait()
        return leases

    host.lease = lease_then_kill
    try:
        killed, computed = counted_generate(remote, prompt, "killed")
    finally:
        host.lease = lease
    assert host.rows.transfer_errors == 1  # the read failed: a miss, the request recomputed
    assert host.counts().load_fallbacks[MOVE_FAILED] == 1  # baton_hicache_load_fallbacks_total
    assert killed.num_cached_tokens_host == 0 and computed == TURN2_TOKENS + DECODES
    remote.engine.check_integrity()
    again, _ = counted_generate(remote, prompt, "killed-again")  # the tier gone: misses, skipped saves
    assert host.tier.outages == 1 and host.tier.skipped_calls > 0
    assert host.counts().tier_up is False  # baton_hicache_tier_up 0
    remote.engine.check_integrity()
    full, _ = counted_generate(plain, turn_one(plain, "full", "take"), "full")  # recomputed from scratch
    assert killed.token_ids == again.token_ids == full.token_ids
    assert bits(killed.logprobs) == bits(again.logprobs) == bits(full.logprobs)


def test_a_restarted_tier_is_used_again(engines, cache):
    """After the kill above: the launcher's supervisor starts the tier again on its port."""
    remote, _ = engines
    host = remote.engine.cache.host
    supervisor = Supervisor([cache], ready_timeout_s=120, interval_s=0.1)
    supervisor.start()
    try:
        deadline = time.monotonic() + 60
        while host.tier.epoch < 2:  # the client attaches to the new run by itself
            assert host.tier.match([b"x" * 32], has_state=True).usable_depth == 0
            assert time.monotonic() < deadline, "the engine did not attach to the restarted tier"
            time.sleep(0.2)
        loaded, computed = counted_generate(remote, turn_one(remote, "restarted", "filler"), "restarted")
    finally:
        supervisor.stop()
    assert cache.restarts == 1 and host.rows.remote.connected_epoch == 2  # the agent connected to the new run
    counts = host.counts()
    assert (counts.tier_up, counts.tier_reconnects) == (True, 1)
    assert loaded.num_cached_tokens_host == LOADED and computed == TURN2_TOKENS - LOADED + DECODES
    remote.engine.check_integrity()


@pytest.fixture(scope="module")
def fp8_tier(tiny_checkpoint):
    """A ``baton cache`` service in this process whose first worker is k3 in the FP8 KV format (an 8-block
    pool): the tier holds that layout. Yields (the service, the FP8 engine)."""
    tier = HostCacheServer(CacheConfig(1 << 20, 1 << 20, port=0, metrics_interval_s=0.1))
    address = f"127.0.0.1:{tier.port}"
    fp8 = LLM(
        str(tiny_checkpoint("k3")),
        kv_format="fp8",
        num_blocks=SMALL_POOL,
        host_cache_address=address,
        **ENGINE_ARGS,
    )
    yield tier, fp8
    tier.stop(grace_s=0)


def test_a_corrupt_page_of_the_node_tier_is_recomputed_and_counted(fp8_tier):
    tier, fp8 = fp8_tier
    prompt = turn_one(fp8, "corrupt", "filler")
    page = _page_of(tier.servicer.tier, blocks_hashes(fp8, TURN1, "corrupt")[1])
    tier.servicer.tier.kv.storage[page, 0] ^= 0xFF  # turn 1's second block, flipped in the tier's memory
    second, computed = counted_generate(fp8, prompt, "corrupt")
    assert second.num_cached_tokens == second.num_cached_tokens_host == 0  # only block 0: no snapshot there
    assert computed == TURN2_TOKENS + DECODES
    cold, _ = counted_generate(fp8, prompt, "cold")  # the same steps without the tier's pages
    assert second.token_ids == cold.token_ids and bits(second.logprobs) == bits(cold.logprobs)
    fp8.engine.check_integrity()
    metrics = f"http://127.0.0.1:{tier.metrics_port}/metrics"
    deadline = time.monotonic() + 10
    while 'baton_hicache_checksum_failures_total{kind="kv"} 1.0' not in scrape(metrics):
        assert time.monotonic() < deadline, scrape(metrics)
        time.sleep(0.1)


def test_a_tier_holding_another_layout_is_refused_and_the_engine_serves_without_it(
    tiny_checkpoint, engines, fp8_tier, caplog
):
    """A tier attached first by the same model in another KV format (FP8 blocks: other page bytes and
    fingerprint) refuses this engine at its attach: the engine logs it naming the field and serves
    without a tier, with the tokens and bits of an engine that never had one."""
    _, plain = engines
    tier, fp8 = fp8_tier
    address = f"127.0.0.1:{tier.port}"
    assert fp8.engine.cache.host is not None  # the first to attach: the tier took its layout
    with caplog.at_level(logging.ERROR, logger="services.engine.host_cache_connector"):
        refused = LLM(str(tiny_checkpoint("k3")), host_cache_address=address, **ENGINE_ARGS)
    (line,) = [r.message for r in caplog.records if "refused this engine" in r.message]
    assert f"host_cache_address: '{address}'" in line and "layout_fingerprint:" in line
    assert refused.engine.cache.host is None and refused.engine.cache.blocks.on_evict is None
    served, computed = counted_generate(refused, TURN1, "refused")  # both cold: the same steps
    alone, _ = counted_generate(plain, TURN1, "alone")
    assert served.num_cached_tokens == 0 and computed == len(TURN1) + DECODES
    assert served.token_ids == alone.token_ids and bits(served.logprobs) == bits(alone.logprobs)
    refused.engine.check_integrity()


def scrape(url: str) -> str:
    return urllib.request.urlopen(url).read().decode()
