"""A worker's load feed without a server: cache events from the block pool, the full picture, coalesced
net changes, a subscriber that falls behind getting a fresh full picture, keepalives, close."""

import time

import pytest
import torch

from proto.baton.v1 import workers_pb2
from services.engine.cache.block_pool import BlockPool, CacheEvent
from services.engine.cache.layout import block_layout
from services.engine.checkpoint.presets import preset_config
from services.engine.model.config_loader import load_model_config
from services.load_feed import LoadFeed


class Board:
    """A ``StatsBoard`` whose stats the test sets."""

    def __init__(self):
        self.stats = workers_pb2.WorkerStats(worker="w", block_size=4)

    def latest(self):
        return self.stats


@pytest.fixture
def pool():
    config = load_model_config(preset_config("k3", "tiny"))
    return BlockPool(block_layout(config, 4, torch.float32), 4, num_blocks=2, device="cpu")


def cache_block(pool: BlockPool, name: bytes) -> None:
    """Fill one block, register it under ``name`` and leave it cached."""
    [block] = pool.allocate(1)
    pool.register(block, name)
    pool.free([block])


def attach(pool: BlockPool, board: Board, **options) -> LoadFeed:
    """A feed over ``pool``'s cache as it is now (what ``EngineService`` does at start)."""
    return LoadFeed(board, "model", True, frozenset(pool.record_events()), **options)


def publish(feed: LoadFeed, pool: BlockPool) -> None:
    """One engine pass: the pool's events since the last one."""
    feed.publish(tuple(pool.take_events()))


def test_the_pool_records_inserts_and_evictions_in_order_once_asked(pool):
    cache_block(pool, b"a")
    assert pool.take_events() == []  # nobody records yet
    assert pool.record_events() == {b"a"}
    cache_block(pool, b"b")
    pool.allocate(2)  # reuses both cached blocks, oldest first
    assert pool.take_events() == [
        CacheEvent(b"b", True),
        CacheEvent(b"a", False),
        CacheEvent(b"b", False),
    ]
    assert pool.take_events() == []


def test_a_subscriber_gets_a_full_picture_then_net_changes(pool):
    board = Board()
    cache_block(pool, b"a")
    feed = attach(pool, board, min_interval_s=0.0, keepalive_s=5.0)
    updates = feed.updates()
    first = next(updates)
    assert first.full and list(first.inserted) == [b"a"] and first.model_fingerprint == "model"
    cache_block(pool, b"b")  # evicts nothing: a free block is left
    board.stats = workers_pb2.WorkerStats(worker="w", block_size=4, running=1)
    publish(feed, pool)
    second = next(updates)
    assert not second.full and list(second.inserted) == [b"b"] and second.stats.running == 1
    updates.close()
    assert feed.subscribers == 0


def test_changes_within_the_interval_are_coalesced_into_their_net_effect(pool):
    board = Board()
    feed = attach(pool, board, min_interval_s=0.2, keepalive_s=5.0)
    publish(feed, pool)
    updates = feed.updates()
    next(updates)
    cache_block(pool, b"a")
    cache_block(pool, b"b")
    time.sleep(0.25)
    publish(feed, pool)  # "a" and "b" inserted: sent (the first change after a quiet spell)
    assert sorted(next(updates).inserted) == [b"a", b"b"]
    pool.allocate(1)  # evicts "a"
    cache_block(pool, b"c")  # evicts "b"; "c" is held now
    publish(feed, pool)  # too soon: kept for the next broadcast
    time.sleep(0.25)
    publish(feed, pool)
    update = next(updates)
    assert list(update.inserted) == [b"c"] and sorted(update.evicted) == [b"a", b"b"]


def test_a_subscriber_that_falls_behind_gets_a_fresh_full_picture(pool):
    board = Board()
    feed = attach(pool, board, min_interval_s=0.0, keepalive_s=5.0, max_queued=2)
    publish(feed, pool)
    updates = feed.updates()
    next(updates)
    for running in range(1, 6):  # nobody reads: publish never waits
        board.stats = workers_pb2.WorkerStats(worker="w", block_size=4, running=running)
        cache_block(pool, b"%d" % running)
        publish(feed, pool)
    caught_up = next(updates)
    assert caught_up.full and caught_up.stats.running == 5
    assert set(caught_up.inserted) == set(pool.block_of)


def test_a_quiet_feed_sends_keepalives_and_close_ends_every_stream(pool):
    board = Board()
    feed = attach(pool, board, keepalive_s=0.05)
    publish(feed, pool)
    updates = feed.updates()
    next(updates)
    keepalive = next(updates)
    assert not keepalive.full and not keepalive.inserted and keepalive.stats.worker == "w"
    feed.close()
    assert list(updates) == []
