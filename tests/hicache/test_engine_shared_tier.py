"""A ``baton cache`` tier on the engine's machine keeps its arenas in shared-memory files
(``services/hicache/shared_pages.py``): the engine maps them and copies rows with torch, not over NIXL,
with the log-prob bits of a device hit. A restarted tier is mapped again, and the files of the run that
died are removed by the next one; an engine on another machine moves the rows over NIXL; a stopped tier
removes its files; a directory that cannot hold the pages is a clear error."""

import logging
import os
import subprocess
import time

import pytest

from deploy.local.supervisor import Supervisor
from services.engine import LLM, host_rows
from services.hicache.server import CacheConfig, HostCacheServer
from services.hicache.shared_pages import PREFIX, create_pages, remove_orphans
from tests.hicache.test_engine_host_cache import (
    DECODES,
    ENGINE_ARGS,
    LOADED,
    SMALL_POOL,
    TURN2_TOKENS,
    bits,
    counted_generate,
    turn_one,
)
from tests.hicache.test_engine_remote_tier import started_cache, tier_engines


@pytest.fixture(scope="module")
def shm_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("shm"))


@pytest.fixture(scope="module")
def cache(shm_dir):
    yield from started_cache(shm_dir)


@pytest.fixture(scope="module")
def engines(tiny_checkpoint, cache):
    return tier_engines(tiny_checkpoint, cache)


def _page_files(shm_dir):
    return sorted(name for name in os.listdir(shm_dir) if name.startswith(PREFIX))


def _nixl_moves(rows):
    """Count the NIXL backend's row moves from now on (a list that grows by one per call)."""
    moves, backend = [], rows.remote.backend
    for name in ("read", "write", "write_bytes"):
        method = getattr(backend, name)
        setattr(
            backend, name, lambda *args, _method=method, **kwargs: moves.append(1) or _method(*args, **kwargs)
        )
    return moves


def test_turn_two_copies_its_prefix_from_the_mapped_pages(engines, shm_dir):
    shared, plain = engines
    host = shared.engine.cache.host
    assert host.rows.mapped_epoch == 1 and len(_page_files(shm_dir)) == 2  # KV and KDA files, mapped
    moves = _nixl_moves(host.rows)
    loaded, computed = counted_generate(shared, turn_one(shared, "load", "filler"), "load")
    assert moves == []  # saves, offloads and the load: all copies of mapped rows
    assert loaded.num_cached_tokens == loaded.num_cached_tokens_host == LOADED
    assert computed == TURN2_TOKENS - LOADED + DECODES
    assert host.snapshots_restored.total() == 1
    shared.engine.check_integrity()
    device, device_computed = counted_generate(plain, turn_one(plain, "device", evict=None), "device")
    assert device.num_cached_tokens == LOADED and device_computed == computed
    assert loaded.token_ids == device.token_ids and bits(loaded.logprobs) == bits(device.logprobs)


def test_a_tier_that_died_is_mapped_again_and_its_files_removed(engines, cache, shm_dir):
    shared, _ = engines
    host = shared.engine.cache.host
    dead = _page_files(shm_dir)
    cache.process.kill()  # no chance to remove its files
    cache.process.wait()
    assert _page_files(shm_dir) == dead
    supervisor = Supervisor([cache], ready_timeout_s=120, interval_s=0.1)
    supervisor.start()
    try:
        deadline = time.monotonic() + 60
        while host.tier.epoch < 2:  # the client attaches to the new run by itself
            host.tier.match([b"x" * 32], has_state=True)
            assert time.monotonic() < deadline, "the engine did not attach to the restarted tier"
            time.sleep(0.2)
        loaded, computed = counted_generate(shared, turn_one(shared, "again", "filler"), "again")
    finally:
        supervisor.stop()
    files = _page_files(shm_dir)
    assert len(files) == 2 and not set(files) & set(dead)  # the new run's files; the dead run's removed
    assert host.rows.mapped_epoch == 2
    assert loaded.num_cached_tokens_host == LOADED and computed == TURN2_TOKENS - LOADED + DECODES
    shared.engine.check_integrity()


def test_an_engine_on_another_machine_moves_rows_over_nixl(
    tiny_checkpoint, engines, cache, monkeypatch, caplog
):
    _, plain = engines
    monkeypatch.setattr(host_rows, "node_id", lambda: "another-machine")
    with caplog.at_level(logging.WARNING, logger="services.engine.host_rows"):
        elsewhere = LLM(
            str(tiny_checkpoint("k3")), num_blocks=SMALL_POOL, host_cache_address=cache.address, **ENGINE_ARGS
        )
    assert any("another machine" in record.message for record in caplog.records)
    host = elsewhere.engine.cache.host
    assert host.rows.mapped_epoch == 0
    moves = _nixl_moves(host.rows)
    loaded, computed = counted_generate(elsewhere, turn_one(elsewhere, "nixl", "filler"), "nixl")
    assert moves and host.rows.transfer_errors == 0
    assert loaded.num_cached_tokens_host == LOADED and computed == TURN2_TOKENS - LOADED + DECODES
    device, _ = counted_generate(plain, turn_one(plain, "nixl-device", evict=None), "nixl-device")
    assert loaded.token_ids == device.token_ids and bits(loaded.logprobs) == bits(device.logprobs)
    elsewhere.engine.check_integrity()


def test_a_stopped_tier_removes_its_files(tiny_checkpoint, tmp_path):
    tier = HostCacheServer(CacheConfig(1 << 20, 1 << 20, port=0, shm_dir=str(tmp_path)))
    try:
        engine = LLM(str(tiny_checkpoint("k3")), host_cache_address=f"127.0.0.1:{tier.port}", **ENGINE_ARGS)
        assert engine.engine.cache.host.rows.mapped_epoch == 1 and len(_page_files(tmp_path)) == 2
    finally:
        tier.stop(grace_s=0)
    assert _page_files(tmp_path) == []


def test_only_the_files_of_dead_tiers_are_swept(tmp_path):
    gone = subprocess.Popen(["true"])  # a tier process that has exited
    gone.wait()
    live = create_pages(str(tmp_path), "live", "kv", 2, 8)  # this process's own tier: kept
    dead = tmp_path / f"{PREFIX}{gone.pid}-old-kv"
    same_pid = tmp_path / f"{PREFIX}{os.getpid()}-previous-kv"  # this pid's earlier life (a pid 1 restarted)
    alive = tmp_path / f"{PREFIX}{os.getppid()}-other-kv"  # another live process's tier
    for path in (dead, same_pid, alive):
        path.write_bytes(b"")
    other = tmp_path / "unrelated"
    other.write_bytes(b"")
    assert remove_orphans(str(tmp_path), "live") == sorted([str(dead), str(same_pid)])
    assert os.path.exists(live.path) and alive.exists() and other.exists()


def test_a_directory_that_cannot_hold_the_pages_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"shm_dir: .*cannot hold"):
        create_pages(str(tmp_path), "big", "kv", 1 << 40, 1 << 20)  # a petabyte
    assert _page_files(tmp_path) == []
    with pytest.raises(ValueError, match=r"shm_dir: '/nonexistent' is not a writable directory .*--shm-dir"):
        CacheConfig(1 << 20, 0, shm_dir="/nonexistent").validate()
