"""The cluster index on a real redis-server: publish, lookup (hybrid rule), TTL expiry, two nodes, and
Redis killed mid-run (soft failure, the up gauge) then restarted (reconnect and republish)."""

import hashlib
import time

import pytest

from common.cluster_index import KDA, KV, ClusterIndex, IndexEvent, IndexMatch, usable_depth
from common.metrics import Metrics
from deploy.local.redis_server import RedisServer
from router.server import RouterConfig
from services.worker_config import load_worker_config


def chain(count: int, seed: str = "a") -> list[bytes]:
    return [hashlib.sha256(f"{seed}{i}".encode()).digest() for i in range(count)]


def inserted(kind: str, hashes) -> list[IndexEvent]:
    return [IndexEvent(kind, h, True) for h in hashes]


class FakeTier:
    """A tier's event source (``HostTier.record_events`` / ``take_events``) holding ``held`` at start."""

    def __init__(self, held: set[tuple[str, bytes]]):
        self.held = held
        self.events: list[IndexEvent] = []

    def record_events(self) -> set[tuple[str, bytes]]:
        return set(self.held)

    def take_events(self) -> list[IndexEvent]:
        events, self.events = self.events, []
        return events


def test_usable_depth_is_the_deepest_snapshot_within_the_kv_run():
    assert usable_depth(5, (2, 4), has_state=True) == 4
    assert usable_depth(3, (2, 4), has_state=True) == 2
    assert usable_depth(5, (), has_state=True) == 0
    assert usable_depth(5, (), has_state=False) == 5


def test_publish_then_lookup_gives_kv_depth_and_snapshots(redis_server, prefix):
    tier = ClusterIndex(redis_server.url, "node-a", prefix=prefix)
    router = ClusterIndex(redis_server.url, prefix=prefix)
    blocks = chain(6)
    assert tier.publish(inserted(KV, blocks[:4]) + inserted(KDA, [blocks[1], blocks[3], blocks[5]]))
    # KV run 4 (block 4 missing); the snapshot under block 5 lies beyond it and does not count.
    assert router.lookup(blocks, has_state=True) == {"node-a": IndexMatch(4, (2, 4), 4)}
    assert router.lookup(blocks, has_state=False) == {"node-a": IndexMatch(4, (2, 4), 4)}
    changes = [
        IndexEvent(KV, blocks[3], False),
        IndexEvent(KV, blocks[2], False),
        IndexEvent(KV, blocks[2], True),
    ]
    assert tier.publish(changes)
    assert router.lookup(blocks, has_state=True) == {"node-a": IndexMatch(3, (2,), 2)}
    assert router.lookup(blocks, has_state=False)["node-a"].usable_depth == 3
    assert router.lookup(chain(3, seed="other"), has_state=False) == {}  # another prompt: no hit
    # Published as hex, one set per kind, with a TTL.
    key = f"{prefix}node:node-a:kv"
    assert router.link.client.smembers(key) == {h.hex().encode() for h in blocks[:3]}
    assert 0 < router.link.client.ttl(key) <= 30


def test_two_nodes_are_scored_apart(redis_server, prefix):
    a = ClusterIndex(redis_server.url, "node-a", prefix=prefix)
    b = ClusterIndex(redis_server.url, "node-b", prefix=prefix)
    router = ClusterIndex(redis_server.url, prefix=prefix)
    blocks = chain(4)
    assert a.publish(inserted(KV, blocks[:2]) + inserted(KDA, blocks[:1]))
    assert b.publish(inserted(KV, blocks) + inserted(KDA, blocks[2:3]))
    assert router.lookup(blocks, has_state=True) == {
        "node-a": IndexMatch(2, (1,), 1),
        "node-b": IndexMatch(4, (3,), 3),
    }


def test_a_silent_node_expires_and_leaves_the_registry(redis_server, prefix):
    live = ClusterIndex(redis_server.url, "live", ttl_s=1, prefix=prefix)
    dead = ClusterIndex(redis_server.url, "dead", ttl_s=1, prefix=prefix)
    router = ClusterIndex(redis_server.url, prefix=prefix)
    blocks = chain(2)
    source = FakeTier({(KV, blocks[0])})
    live.start(source, interval_s=0.2)  # publishes what it holds, then keeps refreshing its TTL
    source.events = inserted(KV, blocks[1:])
    assert dead.publish(inserted(KV, blocks))
    deadline = time.monotonic() + 5  # the live node's first publish runs on its thread: wait for it
    while "live" not in router.lookup(blocks, has_state=False) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(router.lookup(blocks, has_state=False)) == {"live", "dead"}
    deadline = time.monotonic() + 5
    while "dead" in router.lookup(blocks, has_state=False) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert router.lookup(blocks, has_state=False) == {"live": IndexMatch(2, (), 2)}  # its later events too
    assert router.link.client.smembers(f"{prefix}nodes") == {b"live"}
    live.close()


def test_redis_killed_fails_soft_then_reconnects_and_republishes(prefix):
    try:
        server = RedisServer().start()
    except FileNotFoundError as error:
        pytest.skip(f"{error}")
    metrics = Metrics("router")
    gauge = metrics.hicache_redis_up.labels("router")
    tier = ClusterIndex(server.url, "node-a", prefix=prefix)
    router = ClusterIndex(server.url, prefix=prefix, on_health=metrics.redis_health)
    router.link.retry_s = 0.2
    tier.link.retry_s = 0.2
    blocks = chain(3)
    try:
        assert tier.publish(inserted(KV, blocks[:2]))
        assert router.lookup(blocks, has_state=False) == {"node-a": IndexMatch(2, (), 2)}
        assert gauge._value.get() == 1
        server.stop()
        started = time.monotonic()
        assert router.lookup(blocks, has_state=False) == {}  # soft: no exception, no match
        assert not tier.publish(inserted(KV, blocks[2:]))  # kept in the tier's own copy
        assert time.monotonic() - started < 2  # failing is fast: no long retries
        assert gauge._value.get() == 0 and not router.link.up
        assert router.lookup(blocks, has_state=False) == {}  # within retry_s: not even tried
        server.start()  # the same port, empty (no persistence)
        time.sleep(0.25)  # past retry_s
        assert tier.publish([])  # reconnects: the whole set rewritten, the missed event included
        assert router.lookup(blocks, has_state=False) == {"node-a": IndexMatch(3, (), 3)}
        assert gauge._value.get() == 1 and router.link.up
    finally:
        server.stop()


def test_a_publisher_rewrites_sets_redis_lost_while_connected(redis_server, prefix):
    """Sets flushed behind a connected publisher's back (an expiry or FLUSHALL) are rewritten."""
    tier = ClusterIndex(redis_server.url, "node-a", prefix=prefix)
    blocks = chain(2)
    assert tier.publish(inserted(KV, blocks))
    tier.link.client.delete(f"{prefix}node:node-a:kv")
    assert tier.publish([])
    assert tier.lookup(blocks, has_state=False) == {"node-a": IndexMatch(2, (), 2)}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"ttl_s": 0.5}, "ttl_s: must be >= 1"),
        ({"node": "a:b"}, "node: 'a:b' must be a non-empty name"),
    ],
    ids=["ttl-below-a-second", "node-with-colon"],
)
def test_bad_settings_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ClusterIndex("redis://127.0.0.1:1", **kwargs)


def test_bad_events_and_a_reader_publishing_are_refused():
    reader = ClusterIndex("redis://127.0.0.1:1")
    with pytest.raises(ValueError, match="node: a reader"):
        reader.publish([])
    tier = ClusterIndex("redis://127.0.0.1:1", "node-a")
    with pytest.raises(ValueError, match="event: kind 'ssd' is not one of kv, kda"):
        tier.publish([IndexEvent("ssd", b"x", True)])
    with pytest.raises(ValueError, match="interval_s: must be in"):
        tier.start(FakeTier(set()), interval_s=20)


def test_a_configured_url_that_is_not_redis_names_the_field():
    with pytest.raises(ValueError, match="redis_url: 'cache:6379' is not a Redis URL"):
        load_worker_config(flags={"role": "decode", "model": "/m", "redis_url": "cache:6379"})
    with pytest.raises(ValueError, match="redis_url: 'http://cache' is not a Redis URL"):
        RouterConfig(model="/m", redis_url="http://cache")
    assert load_worker_config(flags={"role": "decode", "model": "/m", "redis_url": "redis://c:1"}).redis_url
