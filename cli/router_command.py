"""``baton router``: the router alone, over workers started elsewhere (Kubernetes, Ray, by hand)."""

import argparse
import signal
import threading
from pathlib import Path

from router.server import RouterConfig, RouterServer

from .cluster_secret_flag import add_cluster_secret_flag
from .max_n_flag import add_max_n_flag
from .rate_limit_flags import add_tenant_rate_limit_flags
from .tls_flags import add_internal_tls_flags, add_router_tls_flags
from .token_file import add_auth_token_file_flag

_KUBERNETES_FLAGS = (
    ("namespace", "--namespace"),
    ("prefill_selector", "--prefill-selector"),
    ("decode_selector", "--decode-selector"),
)


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "router", help="run the router alone, over prefill and decode workers listed or discovered"
    )
    parser.add_argument("--model", required=True, type=Path, help="checkpoint folder (config, tokenizer)")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=50051, help="gRPC port (default 50051; 0: any free)")
    parser.add_argument("--http-port", type=int, default=None, help="OpenAI-compatible HTTP front (0: any)")
    parser.add_argument("--metrics-port", type=int, default=0, help="/metrics port (default 0: any free)")
    add_auth_token_file_flag(parser)
    add_tenant_rate_limit_flags(parser)
    add_router_tls_flags(parser)
    add_cluster_secret_flag(parser, "sent on every call to the workers")
    add_internal_tls_flags(parser, "the router's calls to its workers")
    workers = parser.add_argument_group("workers: a fixed list, or found through the Kubernetes API")
    workers.add_argument("--prefill", default="", metavar="HOST:PORT,...", help="prefill worker addresses")
    workers.add_argument("--decode", default="", metavar="HOST:PORT,...", help="decode worker addresses")
    workers.add_argument("--discovery", default="static", choices=("static", "kubernetes"))
    workers.add_argument("--namespace", default="", help="kubernetes: the workers' namespace")
    workers.add_argument(
        "--prefill-selector",
        default="",
        metavar="SEL",
        help="kubernetes: label selector of the prefill workers' EndpointSlices, e.g. "
        "app.kubernetes.io/component=prefill,app.kubernetes.io/instance=REL",
    )
    workers.add_argument(
        "--decode-selector", default="", metavar="SEL", help="kubernetes: the same for decode"
    )
    workers.add_argument("--port-name", default="grpc", help="kubernetes: the workers' gRPC port name")
    parser.add_argument(
        "--redis-url",
        default="",
        metavar="redis://HOST:PORT",
        help="HiCache's cluster index: also score workers by the blocks their node's tier holds",
    )
    parser.add_argument("--colocated", action="store_true", help="no prefill workers: decode prefills all")
    parser.add_argument("--always-disaggregate", action="store_true", help="hand every prompt off")
    parser.add_argument(
        "--local-prefill-tokens",
        type=int,
        default=16,
        metavar="N",
        help="decode prefills a prompt itself when at most N of its tokens are uncached (default 16)",
    )
    parser.add_argument("--max-running", type=int, default=256, help="requests in flight (default 256)")
    parser.add_argument("--max-queued", type=int, default=1024, help="requests waiting (default 1024)")
    parser.add_argument("--max-model-len", type=int, default=4096)
    add_max_n_flag(parser)
    parser.add_argument(
        "--slo-ttft-ms", type=float, default=2000.0, metavar="MS", help="goodput: TTFT target (default 2000)"
    )
    parser.add_argument(
        "--slo-tpot-ms", type=float, default=100.0, metavar="MS", help="goodput: TPOT target (default 100)"
    )
    parser.add_argument(
        "--grace-period",
        type=float,
        default=30.0,
        metavar="S",
        help="on SIGTERM/SIGINT: health NOT_SERVING, then running requests get S seconds (default 30)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    server = RouterServer(config_from(args))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    http = f" http_port={server.http_port}" if server.http_port is not None else ""
    print(
        f"READY role=router discovery={args.discovery} metrics_port={server.metrics_port}{http} "
        f"port={server.port}",
        flush=True,
    )
    stop.wait()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)  # a second signal ends the drain at once
    server.stop(args.grace_period)
    return 0


def config_from(args: argparse.Namespace) -> RouterConfig:
    """The router's configuration from the flags; ValueError naming the flag to fix."""
    prefill, decode = _addresses(args.prefill, "--prefill"), _addresses(args.decode, "--decode")
    if args.colocated and args.always_disaggregate:
        raise ValueError("--colocated and --always-disaggregate: choose one")
    if args.discovery == "static":
        for field, flag in _KUBERNETES_FLAGS:
            if getattr(args, field):
                raise ValueError(f"{flag}: only with --discovery kubernetes")
        if not decode:
            raise ValueError("--decode: give the decode workers (host:port,...) or --discovery kubernetes")
        if not prefill and not args.colocated:
            raise ValueError("--prefill: give the prefill workers (host:port,...) or --colocated")
    else:
        for given, flag in ((prefill, "--prefill"), (decode, "--decode")):
            if given:
                raise ValueError(f"{flag}: fixed addresses and --discovery kubernetes: choose one")
        for field, flag in _KUBERNETES_FLAGS:
            if not getattr(args, field) and not (field == "prefill_selector" and args.colocated):
                raise ValueError(f"{flag}: required with --discovery kubernetes")
    if args.colocated and (prefill or args.prefill_selector):
        raise ValueError(
            f"{'--prefill' if prefill else '--prefill-selector'}: --colocated runs no prefill workers"
        )
    for flag, value, least in (
        ("--local-prefill-tokens", args.local_prefill_tokens, 0),
        ("--max-running", args.max_running, 1),
        ("--max-queued", args.max_queued, 0),
        ("--max-model-len", args.max_model_len, 1),
        ("--max-n", args.max_n, 1),
        ("--grace-period", args.grace_period, 0),
    ):
        if value < least:
            raise ValueError(f"{flag}: must be >= {least}, got {value}")
    for flag, value in (("--slo-ttft-ms", args.slo_ttft_ms), ("--slo-tpot-ms", args.slo_tpot_ms)):
        if not value > 0:
            raise ValueError(f"{flag}: must be > 0, got {value}")
    return RouterConfig(
        model=str(args.model),
        prefill=tuple(prefill),
        decode=tuple(decode),
        discovery=args.discovery,
        namespace=args.namespace,
        prefill_selector=args.prefill_selector,
        decode_selector=args.decode_selector,
        port_name=args.port_name,
        host=args.host,
        port=args.port,
        http_port=args.http_port,
        metrics_port=args.metrics_port,
        max_running=args.max_running,
        max_queued=args.max_queued,
        max_model_len=args.max_model_len,
        max_n=args.max_n,
        redis_url=args.redis_url,
        auth_token_file=args.auth_token_file,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        cluster_secret_file=args.cluster_secret_file,
        internal_tls_cert=args.internal_tls_cert,
        internal_tls_key=args.internal_tls_key,
        internal_tls_ca=args.internal_tls_ca,
        tenant_rate_limit=args.tenant_rate_limit,
        tenant_burst=args.tenant_burst,
        disaggregation="never" if args.colocated else "always" if args.always_disaggregate else "conditional",
        local_prefill_tokens=args.local_prefill_tokens,
        slo_ttft_s=args.slo_ttft_ms / 1000,
        slo_tpot_s=args.slo_tpot_ms / 1000,
    )


def _addresses(text: str, flag: str) -> list[str]:
    """``"a:1,b:2"`` -> ``["a:1", "b:2"]``; ValueError naming ``flag`` for anything not host:port."""
    addresses = [part.strip() for part in text.split(",") if part.strip()]
    for address in addresses:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{flag}: expected host:port,... got {address!r}")
    return addresses
