"""``baton serve --host-cache-gib``: the node's ``baton cache`` (the launcher's ``ManagedCache``, a Ray
tier actor's ``CacheConfig``) sized from the flags, refused naming the flag, and no worker tier of its own."""

import math
from dataclasses import replace

import pytest

from cli.main import build_parser
from cli.serve_command import node_cache, node_cache_config, worker_configs
from services.hicache.server import GIB


def serve(*flags: str):
    return build_parser().parse_args(["serve", "--model", "/m", *flags])


def test_the_node_tier_is_split_by_the_kda_fraction():
    args = serve("--host-cache-gib", "8", "--host-cache-kda-fraction", "0.25")
    worker = replace(worker_configs(args)["decode"], redis_url="redis://127.0.0.1:6390/0", node="n1")
    cache = node_cache(args, worker)
    assert (cache.kv_gib, cache.kda_gib, cache.port) == (6.0, 2.0, 0)  # locally: any free port
    assert cache.argv() == [
        "cache", "--port", "0", "--kv-gib", "6.0", "--kda-gib", "2.0",
        "--redis-url", "redis://127.0.0.1:6390/0", "--node", "n1",  # the workers' index, their node
        "--exit-with-parent",
    ]  # fmt: skip
    config = node_cache_config(args)  # under --ray: every node's tier on the fixed port
    assert (config.kv_budget_bytes, config.kda_budget_bytes, config.port) == (6 * GIB, 2 * GIB, 50070)
    parsed = build_parser().parse_args(cache.argv())  # what `baton cache` is started with parses
    assert (parsed.kv_gib, parsed.kda_gib, parsed.node, parsed.exit_with_parent) == (6.0, 2.0, "n1", True)


def test_no_tier_by_default_and_no_worker_tier_of_its_own():
    configs = worker_configs(serve("--host-cache-gib", "4"))
    assert node_cache(serve(), configs["decode"]) is None and node_cache_config(serve()) is None
    assert all(c.engine.host_cache_gib == 0 and not c.engine.host_cache_address for c in configs.values())


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--host-cache-gib", "-1"], "--host-cache-gib: must be a finite number >= 0"),
        (["--host-cache-gib", "nan"], "--host-cache-gib: must be a finite number >= 0"),
        (
            ["--host-cache-gib", "4", "--host-cache-kda-fraction", "1"],
            "--host-cache-kda-fraction: must be in",
        ),
        (["--host-cache-gib", "4", "--host-cache-port", "0"], "--host-cache-port: a fixed port"),
        (
            ["--host-cache-gib", "4", "--tenant-cache-reserve-pages", "-1"],
            "--tenant-cache-reserve-pages: must be >= 0",
        ),
    ],
    ids=["negative", "nan", "fraction", "ray-port", "reserve-negative"],
)
def test_bad_values_name_the_flag(flags, message):
    with pytest.raises(ValueError, match=message):
        node_cache_config(serve(*flags))  # the sizes as node_cache checks them, and the Ray port


def test_the_launcher_hands_workers_the_tier_address():
    from deploy.local.launcher import with_host_cache

    configs = worker_configs(serve("--host-cache-gib", "4"))
    config = with_host_cache(configs["decode"], "127.0.0.1:50071")
    assert (config.engine.host_cache_address, config.engine.host_cache_gib) == ("127.0.0.1:50071", 0)
    assert math.isclose(
        config.engine.host_cache_kda_fraction, configs["decode"].engine.host_cache_kda_fraction
    )


def test_the_l3_goes_to_the_node_tier_and_no_redis_turns_it_off():
    from cli.serve_command import check_node_l3

    args = serve("--host-cache-gib", "8", "--redis-l3-gib", "2")
    assert all(c.engine.redis_l3_gib == 0 for c in worker_configs(args).values())  # not each worker's
    worker = replace(worker_configs(args)["decode"], redis_url="redis://127.0.0.1:6390/0")
    cache = node_cache(args, worker)
    assert cache.argv()[-3:-1] == ["--redis-l3-gib", "2.0"] and cache.l3_gib == 2.0
    assert build_parser().parse_args(cache.argv()).redis_l3_gib == 2.0
    assert node_cache(args, worker_configs(args)["decode"]).l3_gib == 0  # no Redis (--no-redis): no L3
    ray = serve("--host-cache-gib", "8", "--redis-l3-gib", "2", "--redis-url", "redis://r:1")
    assert node_cache_config(ray).l3_budget_bytes == 2 * GIB
    with pytest.raises(ValueError, match=r"--redis-l3-gib: the L3 sits below the node's tier"):
        check_node_l3(serve("--redis-l3-gib", "2"))
    with pytest.raises(ValueError, match=r"--redis-l3-gib: must be a finite number >= 0"):
        check_node_l3(serve("--host-cache-gib", "8", "--redis-l3-gib", "-1"))


def test_the_tenant_reserve_goes_to_the_node_tier():
    args = serve("--host-cache-gib", "8", "--tenant-cache-reserve-pages", "16")
    cache = node_cache(args, worker_configs(args)["decode"])
    assert cache.argv()[-3:-1] == ["--tenant-cache-reserve-pages", "16"]
    assert build_parser().parse_args(cache.argv()).tenant_cache_reserve_pages == 16
    assert node_cache_config(args).tenant_cache_reserve_pages == 16  # under --ray
    with pytest.raises(ValueError, match="--tenant-cache-reserve-pages: must be >= 0, got -1"):
        node_cache(
            serve("--host-cache-gib", "8", "--tenant-cache-reserve-pages", "-1"),
            worker_configs(args)["decode"],
        )
