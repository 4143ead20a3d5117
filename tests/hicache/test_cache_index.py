"""``baton cache`` with ``--redis-url`` publishes its tier to the cluster index: from the first Attach, what
workers commit shows up for the router under the tier's node name, and evictions leave it."""

import argparse
import time

import pytest

from cli import cache_command
from common.cluster_index import ClusterIndex, IndexMatch
from common.prefix_hash import chain_root, extend_chain
from services.hicache.client import HostCacheClient
from services.hicache.host_tier import KDA, KV
from services.hicache.server import CacheConfig, HostCacheServer

KV_PAGE, KDA_PAGE = 64, 128


def commit(client: HostCacheClient, kind: str, hashes: list[bytes]) -> None:
    lease = client.reserve_put(kind, hashes)
    client.commit_put(lease.lease_id)


def eventually(check, timeout_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    while not (result := check()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return result


def test_the_tier_publishes_what_it_holds(redis_server):
    """(This module's redis-server is its own: the server's default key prefix is safe to use.)"""
    config = CacheConfig(
        kv_budget_bytes=4 * KV_PAGE,
        kda_budget_bytes=2 * KDA_PAGE,
        port=0,
        redis_url=redis_server.url,
        node="node-x",
        index_ttl_s=3,
        index_interval_s=0.1,
    )
    server = HostCacheServer(config)
    router = ClusterIndex(redis_server.url)
    client = HostCacheClient(f"127.0.0.1:{server.port}")
    first = extend_chain([], list(range(12)), 4, chain_root("model"))
    second = extend_chain([], list(range(50, 62)), 4, chain_root("model"))
    try:
        client.attach("layout", KV_PAGE, KDA_PAGE)
        commit(client, KV, first)
        commit(client, KDA, first[1:2])
        want = {"node-x": IndexMatch(3, (2,), 2)}
        assert eventually(lambda: router.lookup(first, has_state=True) == want)
        commit(client, KV, second)  # 4 pages: evicts first's tail
        assert eventually(lambda: router.lookup(first, has_state=True) == {"node-x": IndexMatch(1, (), 0)})
        assert server.metrics.hicache_redis_up.labels("cache")._value.get() == 1
    finally:
        client.close()
        server.stop()


@pytest.mark.parametrize(
    "flags, error",
    [
        (["--redis-url", "cache:6379"], "--redis-url: 'cache:6379' is not a Redis URL"),
        (["--redis-url", "redis://r:1"], None),
    ],
    ids=["not-a-url", "a-url"],
)
def test_cache_command_redis_flags(flags, error):
    parser = argparse.ArgumentParser()
    cache_command.register(parser.add_subparsers())
    args = parser.parse_args(["cache", "--kv-gib", "1", *flags])
    if error:
        with pytest.raises(ValueError, match=error):
            cache_command.config_from(args)
    else:
        assert cache_command.config_from(args).redis_url == "redis://r:1"
