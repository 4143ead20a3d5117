"""``baton cache``: the node's HiCache host tier (one per node; workers attach to it over gRPC)."""

import argparse
import math
import os
import signal
import threading

from common.cluster_secret import read_cluster_secret
from common.internal_tls import internal_tls
from common.redis_link import check_redis_url
from services.hicache.server import GIB, CacheConfig, HostCacheServer

from .cluster_secret_flag import add_cluster_secret_flag
from .tls_flags import add_internal_tls_flags
from .worker_command import watch_parent


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "cache", help="run the node's host tier of KV blocks and KDA snapshots (HiCache), served over NIXL"
    )
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=50070, help="gRPC port (default 50070; 0: any free)")
    parser.add_argument("--kv-gib", type=float, required=True, metavar="G", help="host memory for KV blocks")
    parser.add_argument(
        "--kda-gib", type=float, default=0.0, metavar="G", help="host memory for KDA snapshots (default 0)"
    )
    parser.add_argument("--metrics-port", type=int, default=0, help="/metrics port (default 0: any free)")
    parser.add_argument(
        "--redis-url",
        default="",
        metavar="redis://HOST:PORT",
        help="publish what the tier holds to HiCache's cluster index there (default: none)",
    )
    parser.add_argument(
        "--redis-l3-gib",
        type=float,
        default=0.0,
        metavar="G",
        help="a Redis L3 below the tier, G GiB for the whole cluster: pages the tier evicts are written "
        "there, and a worker's prefetch reads them back (needs --redis-url; default 0: none)",
    )
    parser.add_argument(
        "--node",
        default="",
        help="the tier's name in the cluster index: its workers' --node (default: the host name)",
    )
    parser.add_argument(
        "--shm-dir",
        default="/dev/shm",
        metavar="DIR",
        help="keep the pages in shared-memory files here, which workers on this machine map and copy "
        "directly (workers elsewhere use NIXL); '' keeps them private, NIXL only (default /dev/shm)",
    )
    parser.add_argument(
        "--tenant-cache-reserve-pages",
        type=int,
        default=0,
        metavar="N",
        help="pages each tenant keeps in each arena (KV, KDA): another tenant's puts never evict them "
        "(default 0: plain LRU)",
    )
    add_cluster_secret_flag(parser, "every call but health checks must carry it; workers send it")
    add_internal_tls_flags(parser, "the workers' calls to this tier")
    parser.add_argument(
        "--exit-with-parent", action="store_true", help="stop when the starting process exits"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    server = HostCacheServer(config_from(args))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if args.exit_with_parent:  # baton serve killed outright: its tier goes with it
        threading.Thread(target=watch_parent, args=(os.getppid(), stop), daemon=True).start()
    print(f"READY role=cache metrics_port={server.metrics_port} port={server.port}", flush=True)
    stop.wait()
    server.stop()
    return 0


def config_from(args: argparse.Namespace) -> CacheConfig:
    """The service's ``CacheConfig`` from the flags; ValueError naming the flag to fix."""
    for flag, value in (("--kv-gib", args.kv_gib), ("--kda-gib", args.kda_gib)):
        if not value >= 0:
            raise ValueError(f"{flag}: must be >= 0, got {value}")
    if args.kv_gib == 0:
        raise ValueError("--kv-gib: must be > 0 (the KV tier's host memory)")
    check_redis_url("--redis-url", args.redis_url)
    check_l3_gib("--redis-l3-gib", args.redis_l3_gib, args.redis_url)
    check_reserve_pages("--tenant-cache-reserve-pages", args.tenant_cache_reserve_pages)
    return CacheConfig(
        kv_budget_bytes=int(args.kv_gib * GIB),
        kda_budget_bytes=int(args.kda_gib * GIB),
        host=args.host,
        port=args.port,
        metrics_host=args.host,
        metrics_port=args.metrics_port,
        redis_url=args.redis_url,
        node=args.node,
        l3_budget_bytes=int(args.redis_l3_gib * GIB),
        shm_dir=args.shm_dir,
        tenant_cache_reserve_pages=args.tenant_cache_reserve_pages,
        cluster_secret=read_cluster_secret(args.cluster_secret_file) if args.cluster_secret_file else "",
        internal_tls=internal_tls(args.internal_tls_cert, args.internal_tls_key, args.internal_tls_ca),
    )


def check_l3_gib(flag: str, gib: float, redis_url: str) -> None:
    """An L3 size as given on ``flag``: a finite number >= 0, and > 0 only with a Redis URL.

    Raises:
        ValueError: naming ``flag``.
    """
    if not (math.isfinite(gib) and gib >= 0):
        raise ValueError(f"{flag}: must be a finite number >= 0 (0: no L3), got {gib}")
    if gib > 0 and not redis_url:
        raise ValueError(f"{flag}: the L3 lives in Redis: give --redis-url too (or set {flag} 0)")


def check_reserve_pages(flag: str, pages: int) -> None:
    """A per-tenant page reserve as given on ``flag``: an integer >= 0.

    Raises:
        ValueError: naming ``flag``.
    """
    if pages < 0:
        raise ValueError(f"{flag}: must be >= 0, got {pages}")
