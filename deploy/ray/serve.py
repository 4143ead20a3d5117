"""``baton serve --ray``: the cluster on Ray until Ctrl-C, then every actor and placement group gone."""

import argparse
import logging
import signal
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from common.internal_tls import InternalTls
from router.server import RouterConfig
from services.hicache.server import CacheConfig
from services.worker_config import WorkerConfig

from .cluster import RayCluster, RayClusterConfig


def cluster_config(
    args: argparse.Namespace,
    disaggregation: str,
    workers: Mapping[str, WorkerConfig],
    host_cache: CacheConfig | None = None,
    cluster_secret: str = "",
    internal_tls: InternalTls | None = None,
) -> RayClusterConfig:
    """The ``RayClusterConfig`` that ``baton serve``'s flags describe; ``workers``: its per-role
    ``WorkerConfig`` (``cli.serve_command.worker_configs``), the same the local launcher starts;
    ``host_cache``: each node's tier (``--host-cache-gib``), or None; ``cluster_secret``: the one
    every actor gets (``baton serve`` always has one); ``internal_tls``: the internal mutual TLS, read on
    the driver and given to every actor as a value (None: plaintext)."""
    model = str(args.model)
    router = RouterConfig(
        model=model,
        prefill=(),
        decode=(),
        port=args.port,
        metrics_port=args.metrics_port,
        http_port=args.http_port,
        disaggregation=disaggregation,
        local_prefill_tokens=args.local_prefill_tokens,
        slo_ttft_s=args.slo_ttft_ms / 1000,
        slo_tpot_s=args.slo_tpot_ms / 1000,
        redis_url=args.redis_url,
        auth_token_file=args.auth_token_file,  # a path on the node the router actor runs on
        tls_cert=args.tls_cert,  # the same for the TLS files
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        tenant_rate_limit=args.tenant_rate_limit,
        tenant_burst=args.tenant_burst,
        max_n=args.max_n,
    )
    return RayClusterConfig(
        router=router,
        workers=workers,
        prefill_workers=args.prefill_workers,
        decode_workers=args.decode_workers,
        worker_num_cpus=args.worker_num_cpus,
        worker_num_gpus=args.worker_num_gpus,
        placement_strategy=args.placement_strategy,
        host_cache=host_cache,
        cluster_secret=cluster_secret,
        internal_tls=internal_tls,
    )


def serve_on_ray(
    args: argparse.Namespace,
    disaggregation: str,
    announce: Callable[[str, str, list[tuple[str, str]], str | None], None],
    workers: Mapping[str, WorkerConfig],
    host_cache: CacheConfig | None = None,
    cluster_secret: str = "",
    internal_tls: InternalTls | None = None,
) -> int:
    """Run the cluster on Ray (``--ray-address``; none: a local Ray instance started here) until
    SIGINT / SIGTERM; ``announce(router, metrics, [(name, address)], http)`` prints the SERVING line;
    ``workers``: each role's ``WorkerConfig``; ``host_cache``: each node's tier, or None;
    ``cluster_secret``, ``internal_tls``: given to every actor as values.
    """
    if not Path(args.model).is_dir() and args.ray_address is None:
        raise FileNotFoundError(f"--model: {args.model} is not a folder")  # local: check before Ray starts
    config = cluster_config(args, disaggregation, workers, host_cache, cluster_secret, internal_tls)
    logging.getLogger("deploy.ray").setLevel(logging.INFO)
    cluster = RayCluster(config, ray_address=args.ray_address)
    try:
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        endpoints = cluster.endpoints
        workers = [(w.name, w.info.address) for w in cluster.workers]
        announce(endpoints.grpc, endpoints.metrics, workers, endpoints.http)
        stop.wait()
    finally:
        cluster.stop()
    return 0
