"""``baton serve``: the local cluster (prefill and decode workers, router) until Ctrl-C; ``--ray``: the
same cluster as Ray actors (``deploy/ray``)."""

import argparse
import json
import logging
import math
import secrets
import shutil
import signal
import tempfile
import threading
from dataclasses import replace
from functools import partial
from pathlib import Path

from common.cluster_secret import read_cluster_secret, write_cluster_secret
from common.internal_tls import internal_tls
from deploy.local.launcher import LocalCluster, ManagedCache
from deploy.local.redis_server import RedisServer
from router.auth_tokens import parse_token_file
from router.tenant_rate_limit import from_flags
from router.tls import ServerTls, server_tls
from services.config_flags import add_config_flags, engine_config
from services.engine.engine_config import PARALLEL_DEGREES, EngineConfig
from services.engine.parallel.parallel_check import check_parallel
from services.hicache.server import GIB, CacheConfig
from services.worker_config import ROLES, WorkerConfig

from .cache_command import check_reserve_pages
from .cluster_secret_flag import add_cluster_secret_flag
from .max_n_flag import add_max_n_flag, checked_max_n
from .rate_limit_flags import add_tenant_rate_limit_flags
from .tls_flags import add_internal_tls_flags, add_router_tls_flags
from .token_file import add_auth_token_file_flag

log = logging.getLogger(__name__)
# EngineConfig's per-worker tier fields (hcengine's): under `baton serve` the node's tier takes their place.
NODE_TIER_FIELDS = ("host_cache_gib", "host_cache_address", "host_cache_kda_fraction", "redis_l3_gib")


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("serve", help="run a local cluster: prefill and decode workers and a router")
    parser.add_argument("--port", type=int, default=50051, help="router gRPC port (default 50051; 0: any)")
    parser.add_argument(
        "--metrics-port", type=int, default=0, help="router /metrics port (default 0: any free)"
    )
    parser.add_argument(
        "--http-port", type=int, default=None, help="OpenAI-compatible HTTP front (default: none; 0: any)"
    )
    add_auth_token_file_flag(parser)
    add_tenant_rate_limit_flags(parser)
    add_max_n_flag(parser)
    add_router_tls_flags(parser)
    add_cluster_secret_flag(
        parser,
        "what the router, the workers and the tier require of each other's calls (default: a fresh random "
        "one, in a file only this user can read in a folder removed at exit)",
    )
    add_internal_tls_flags(parser, "every call between the router, the workers and the tier")
    parser.add_argument("--prefill-workers", type=int, default=1)
    parser.add_argument("--decode-workers", type=int, default=1)
    parser.add_argument(
        "--colocated",
        action="store_true",
        help="no prefill workers: each decode worker prefills its own requests (for comparison)",
    )
    parser.add_argument(
        "--local-prefill-tokens",
        type=int,
        default=16,
        metavar="N",
        help="decode prefills a prompt itself when at most N of its tokens are uncached (default 16)",
    )
    parser.add_argument(
        "--always-disaggregate", action="store_true", help="hand every prompt off, however short"
    )
    parser.add_argument(
        "--slo-ttft-ms",
        type=float,
        default=2000.0,
        metavar="MS",
        help="goodput: time-to-first-token target (default 2000; baton_requests_slo_met_total)",
    )
    parser.add_argument(
        "--slo-tpot-ms",
        type=float,
        default=100.0,
        metavar="MS",
        help="goodput: time-per-output-token target (default 100)",
    )
    parser.add_argument(
        "--grace-period",
        type=float,
        default=30.0,
        metavar="S",
        help="each worker's --grace-period: after SIGTERM it takes no new work and its running requests "
        "get S seconds before the router moves them (default 30)",
    )
    parser.add_argument("--transfer-backend", default="nixl", help="nixl or grpc_bytes (default nixl)")
    redis = parser.add_argument_group("HiCache's cluster index and L3 (Redis)")
    redis.add_argument(
        "--redis-url",
        default="",
        metavar="redis://HOST:PORT",
        help="a Redis to use (default: start a redis-server on a free local port; with --ray, none)",
    )
    redis.add_argument("--no-redis", action="store_true", help="no Redis: no cluster index, no L3")
    redis.add_argument(
        "--redis-l3-gib",
        dest="node_l3_gib",  # not EngineConfig's redis_l3_gib: the node's tier has the L3, not each worker
        type=float,
        default=0.0,
        metavar="G",
        help="GiB of Redis for an L3 below the node's tier (--host-cache-gib): pages it evicts are written "
        "there and prefetched back for requests that match them (default 0: none; off with --no-redis)",
    )
    engine = parser.add_argument_group("every worker's engine (baton worker's engine flags)")
    # The host tier is the node's `baton cache` here (below), not one inside each worker.
    add_config_flags(engine, EngineConfig, exclude=NODE_TIER_FIELDS)
    engine.add_argument("--prefill-device", default=None, help="prefill workers' device (default: --device)")
    engine.add_argument("--decode-device", default=None, help="decode workers' device (default: --device)")
    for role in ROLES:
        engine.add_argument(
            f"--{role}-parallel",
            default="",
            metavar="DIM=N,...",
            help=f"{role} workers' parallel degrees over --tp/--dcp/--pp/--pcp/--ep, e.g. "
            + ("pcp=2" if role == "prefill" else "tp=2,ep=2"),
        )
    tier = parser.add_argument_group("the node's HiCache host tier (docs/hicache.md)")
    tier.add_argument(
        "--host-cache-gib",
        dest="node_cache_gib",  # not EngineConfig's host_cache_gib: no worker gets a tier of its own
        type=float,
        default=0.0,
        metavar="G",
        help="host memory of the node's `baton cache` tier (KV blocks and KDA snapshots), which every worker "
        "uses (default 0: no tier)",
    )
    tier.add_argument(
        "--host-cache-kda-fraction",
        dest="node_cache_kda_fraction",
        type=float,
        default=0.25,
        metavar="F",
        help="share of --host-cache-gib for KDA snapshots, the rest for KV blocks (default 0.25)",
    )
    tier.add_argument(
        "--tenant-cache-reserve-pages",
        type=int,
        default=0,
        metavar="N",
        help="pages of the node's tier each tenant keeps in each arena (KV, KDA): another tenant's load "
        "never evicts them (default 0: plain LRU)",
    )
    ray = parser.add_argument_group("on Ray (pip install 'baton[ray]')")
    ray.add_argument("--ray", action="store_true", help="run the workers and router as Ray actors")
    ray.add_argument(
        "--ray-address", default=None, help="auto, ray://HOST:10001, ... (default: start a local Ray)"
    )
    ray.add_argument("--worker-num-cpus", type=float, default=1.0, help="CPUs per worker rank (default 1)")
    ray.add_argument("--worker-num-gpus", type=float, default=0.0, help="GPUs per worker rank (default 0)")
    ray.add_argument(
        "--placement-strategy",
        default="PACK",
        choices=("PACK", "STRICT_PACK", "SPREAD"),
        help="placement group strategy of each role's worker ranks (default PACK)",
    )
    ray.add_argument(
        "--host-cache-port",
        type=int,
        default=50070,
        help="the port of each node's HiCache tier actor (with --host-cache-gib; default 50070)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.no_redis and args.redis_url:
        raise ValueError("--redis-url and --no-redis: choose one")
    check_node_l3(args)
    if args.auth_token_file:
        parse_token_file(args.auth_token_file)  # a bad file fails here, before any worker starts
    tls = server_tls(args.tls_cert, args.tls_key, args.tls_client_ca)  # so do bad TLS files
    from_flags(args.tenant_rate_limit, args.tenant_burst)  # and a bad rate limit
    checked_max_n(args)  # and a bad --max-n
    given_secret = read_cluster_secret(args.cluster_secret_file) if args.cluster_secret_file else ""
    internal = internal_tls(args.internal_tls_cert, args.internal_tls_key, args.internal_tls_ca)
    configs = worker_configs(args, args.redis_url)
    if args.ray:
        from deploy.ray.serve import serve_on_ray  # Ray is optional: only --ray imports it

        secret = given_secret or secrets.token_urlsafe(32)  # a value: each actor gets it as an argument
        announce_tls = partial(announce, tls=tls)
        return serve_on_ray(
            args, _disaggregation(args), announce_tls, configs, node_cache_config(args), secret, internal
        )
    for config in configs.values():  # a layout that cannot run fails here, before any worker starts
        check_parallel(config.engine)
    logging.getLogger("deploy.local.launcher").setLevel(logging.INFO)
    redis = None
    if not args.no_redis and not args.redis_url:
        redis = _start_redis()
        if redis is not None:
            configs = {role: replace(config, redis_url=redis.url) for role, config in configs.items()}
    run_folder = tempfile.mkdtemp(prefix="baton-serve-")  # mode 0700: this user's only
    try:
        secret_file = args.cluster_secret_file or str(
            write_cluster_secret(Path(run_folder) / "cluster-secret")
        )
        return _serve_locally(args, configs, tls, secret_file)
    finally:
        shutil.rmtree(run_folder, ignore_errors=True)
        if redis is not None:
            redis.stop()


def check_node_l3(args: argparse.Namespace) -> None:
    """``--redis-l3-gib``: a finite size >= 0, and > 0 only with a node tier; ``--no-redis`` turns it off
    (said once in the log)."""
    gib = args.node_l3_gib
    if not (math.isfinite(gib) and gib >= 0):
        raise ValueError(f"--redis-l3-gib: must be a finite number >= 0 (0: no L3), got {gib}")
    if gib > 0 and not args.node_cache_gib > 0:
        raise ValueError(
            "--redis-l3-gib: the L3 sits below the node's tier: give --host-cache-gib too, or set 0"
        )
    if gib > 0 and args.no_redis:
        log.warning("--redis-l3-gib %g: off, --no-redis gives the tier no Redis", gib)


def _start_redis() -> RedisServer | None:
    """A redis-server on a free local port for the cluster index; None (and a warning) without the
    binary: everything still works, node-locally."""
    try:
        server = RedisServer()
    except FileNotFoundError as error:
        log.warning("%s; serving without the cluster index", error)
        return None
    server.start()
    log.info("redis-server for the cluster index on %s", server.url)
    return server


def _serve_locally(
    args: argparse.Namespace,
    configs: dict[str, WorkerConfig],
    tls: ServerTls | None,
    cluster_secret_file: str,
) -> int:
    cluster = LocalCluster(
        str(args.model),
        args.port,
        args.prefill_workers,
        args.decode_workers,
        metrics_port=args.metrics_port,
        http_port=args.http_port,
        disaggregation=_disaggregation(args),
        local_prefill_tokens=args.local_prefill_tokens,
        slo_ttft_s=_positive_ms(args.slo_ttft_ms, "--slo-ttft-ms") / 1000,
        slo_tpot_s=_positive_ms(args.slo_tpot_ms, "--slo-tpot-ms") / 1000,
        configs=configs,
        host_cache=node_cache(args, configs["decode"]),
        redis_url=configs["decode"].redis_url,
        auth_token_file=args.auth_token_file,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        cluster_secret_file=cluster_secret_file,
        tenant_rate_limit=args.tenant_rate_limit,
        tenant_burst=args.tenant_burst,
        max_n=args.max_n,
        internal_tls_files=(args.internal_tls_cert, args.internal_tls_key, args.internal_tls_ca),
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    http_port = cluster.router.http_port
    announce(
        f"127.0.0.1:{cluster.port}",
        f"127.0.0.1:{cluster.router.metrics_port}",
        [(w.name, w.address) for w in cluster.workers],
        None if http_port is None else f"127.0.0.1:{http_port}",
        tls,
    )
    stop.wait()
    cluster.stop()
    return 0


# In the demo model's language (models/k3-demo: five English Bible translations) and long enough (36
# tokens) to be handed off over NIXL rather than prefilled on decode.
_EXAMPLE_PROMPT = (
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; "
    "and darkness was upon the face of the deep. And God said,"
)


def announce(
    router: str, metrics: str, workers: list[tuple[str, str]], http: str | None, tls: ServerTls | None = None
) -> None:
    """Print the ``SERVING router=... metrics=... workers=name@address,...`` line and how to ask; with
    ``tls``, the example commands carry the TLS flags a client needs (the CA's file is the user's)."""
    print(
        f"SERVING router={router} metrics={metrics} workers=" + ",".join(f"{n}@{a}" for n, a in workers),
        flush=True,
    )
    grpc_tls, curl_tls, scheme = "", "", ""
    if tls is not None:
        grpc_tls, curl_tls, scheme = " --tls-ca CA.pem", " --cacert CA.pem", "https://"
        if tls.mutual:
            grpc_tls += " --tls-cert CLIENT.pem --tls-key CLIENT.key"
            curl_tls += " --cert CLIENT.pem --key CLIENT.key"
    print(
        f'send a request: baton client generate --addr {router}{grpc_tls} --prompt "{_EXAMPLE_PROMPT}" '
        "--max-tokens 24 --json",
        flush=True,
    )
    if tls is not None:
        print(
            f"  (TLS: CA.pem is the CA that signed {tls.cert}; the certificate must name the host dialled"
            + (", and CLIENT.pem be signed by --tls-client-ca" if tls.mutual else "")
            + ")",
            flush=True,
        )
    if http is not None:
        body = json.dumps({"prompt": _EXAMPLE_PROMPT, "max_tokens": 24, "temperature": 0})
        print(
            f"or over HTTP: curl -s{curl_tls} {scheme}{http}/v1/completions "
            f"-H 'Content-Type: application/json' -d '{body}'",
            flush=True,
        )


def worker_configs(args: argparse.Namespace, redis_url: str = "") -> dict[str, WorkerConfig]:
    """``{role: WorkerConfig}``: every worker's engine from the engine flags, on its role's device, and
    ``redis_url`` (HiCache's cluster index; "": none); the launcher hands each worker its config as a
    ``--config`` file, the Ray path as the object.

    Raises:
        ValueError: naming the flag (``--kv-format: ...``, ``--decode-device: ...``).
    """
    if not args.grace_period >= 0:
        raise ValueError(f"--grace-period: must be >= 0, got {args.grace_period}")
    configs = {}
    for role in ROLES:
        flag = f"--{role}-device"
        device = getattr(args, flag[2:].replace("-", "_")) or args.device
        degrees = role_degrees(getattr(args, f"{role}_parallel"), f"--{role}-parallel")
        try:
            engine = engine_config(args, device=device, **degrees)
        except ValueError as error:  # a bad --prefill-device is named as that flag, not --device
            if device != args.device and str(error).startswith("--device:"):
                raise ValueError(flag + str(error).removeprefix("--device")) from None
            raise
        configs[role] = WorkerConfig(
            role,
            engine,
            transfer_backend=args.transfer_backend,
            grace_period_s=args.grace_period,
            redis_url=redis_url,
        )
    return configs


def node_cache(args: argparse.Namespace, worker: WorkerConfig) -> ManagedCache | None:
    """The node's ``baton cache`` sized by ``--host-cache-gib`` and ``--host-cache-kda-fraction``,
    publishing to the workers' cluster index under their node name (``worker``'s ``redis_url``, ``node``);
    None for 0 (no tier: workers without one).

    Raises:
        ValueError: naming the flag.
    """
    kv_gib, kda_gib = node_cache_split(args.node_cache_gib, args.node_cache_kda_fraction)
    check_reserve_pages("--tenant-cache-reserve-pages", args.tenant_cache_reserve_pages)
    if kv_gib == 0:
        return None
    l3_gib = args.node_l3_gib if worker.redis_url else 0.0  # no Redis (--no-redis, no binary): no L3
    return ManagedCache(
        kv_gib,
        kda_gib,
        redis_url=worker.redis_url,
        node=worker.node,
        l3_gib=l3_gib,
        tenant_reserve_pages=args.tenant_cache_reserve_pages,
    )


def node_cache_config(args: argparse.Namespace) -> CacheConfig | None:
    """Each node's tier under ``--ray`` (on ``--host-cache-port``); None without ``--host-cache-gib``."""
    kv_gib, kda_gib = node_cache_split(args.node_cache_gib, args.node_cache_kda_fraction)
    check_reserve_pages("--tenant-cache-reserve-pages", args.tenant_cache_reserve_pages)
    if kv_gib == 0:
        return None
    if not 0 < args.host_cache_port < 65536:
        raise ValueError(f"--host-cache-port: a fixed port in 1..65535, got {args.host_cache_port}")
    # Each node's tier and its workers name the node by its host name (their default) in the index.
    l3_bytes = int(args.node_l3_gib * GIB) if args.redis_url else 0  # with --ray, only --redis-url gives one
    return CacheConfig(
        int(kv_gib * GIB),
        int(kda_gib * GIB),
        port=args.host_cache_port,
        redis_url=args.redis_url or "",
        l3_budget_bytes=l3_bytes,
        tenant_cache_reserve_pages=args.tenant_cache_reserve_pages,
    )


def node_cache_split(gib: float, kda_fraction: float) -> tuple[float, float]:
    """``(kv_gib, kda_gib)`` of a node tier of ``gib`` GiB; ``(0, 0)`` for none.

    Raises:
        ValueError: naming ``--host-cache-gib`` or ``--host-cache-kda-fraction``.
    """
    if not (math.isfinite(gib) and gib >= 0):
        raise ValueError(f"--host-cache-gib: must be a finite number >= 0 (0: no tier), got {gib}")
    if not 0 <= kda_fraction < 1:
        raise ValueError(
            f"--host-cache-kda-fraction: must be in [0, 1) (the KV blocks need a share), got {kda_fraction}"
        )
    return gib * (1 - kda_fraction), gib * kda_fraction


def role_degrees(text: str, flag: str) -> dict[str, int]:
    """``"tp=2,ep=2"`` -> ``{"tp": 2, "ep": 2}``; "" -> ``{}`` (the shared --tp ... flags hold).

    Raises:
        ValueError: an unknown dimension, a value that is not a positive integer, or a dimension given
            twice, naming ``flag``.
    """
    degrees: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in PARALLEL_DEGREES:
            raise ValueError(f"{flag}: {part!r} is not DIM=N with DIM one of {', '.join(PARALLEL_DEGREES)}")
        if name in degrees:
            raise ValueError(f"{flag}: {name} is given twice")
        if not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"{flag}: {name} must be a positive integer, got {value.strip()!r}")
        degrees[name] = int(value)
    return degrees


def _disaggregation(args: argparse.Namespace) -> str:
    if args.colocated and args.always_disaggregate:
        raise ValueError("--colocated and --always-disaggregate: choose one")
    if args.local_prefill_tokens < 0:
        raise ValueError("--local-prefill-tokens: must be >= 0")
    return "never" if args.colocated else "always" if args.always_disaggregate else "conditional"


def _positive_ms(value: float, flag: str) -> float:
    if not value > 0:
        raise ValueError(f"{flag}: must be > 0, got {value}")
    return value
