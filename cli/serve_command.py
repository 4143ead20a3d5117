"""``baton serve``: the local cluster (prefill and decode workers, router) until Ctrl-C."""

import argparse
import logging
import signal
import threading
from pathlib import Path

from services.launcher import LocalCluster


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("serve", help="run a local cluster: prefill and decode workers and a router")
    parser.add_argument("--model", required=True, type=Path, help="checkpoint folder")
    parser.add_argument("--port", type=int, default=50051, help="router gRPC port (default 50051; 0: any)")
    parser.add_argument(
        "--metrics-port", type=int, default=0, help="router /metrics port (default 0: any free)"
    )
    parser.add_argument(
        "--http-port", type=int, default=None, help="OpenAI-compatible HTTP front (default: none; 0: any)"
    )
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
    parser.add_argument("--transfer-backend", default="nixl", help="nixl or grpc_bytes (default nixl)")
    parser.add_argument("--batch-invariant", action="store_true")
    parser.add_argument("--dtype", default=None)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    worker_args = ["--transfer-backend", args.transfer_backend]
    if args.batch_invariant:
        worker_args.append("--batch-invariant")
    if args.dtype:
        worker_args += ["--dtype", args.dtype]
    logging.getLogger("services.launcher").setLevel(logging.INFO)
    cluster = LocalCluster(
        str(args.model),
        args.port,
        args.prefill_workers,
        args.decode_workers,
        worker_args,
        metrics_port=args.metrics_port,
        http_port=args.http_port,
        disaggregation=_disaggregation(args),
        local_prefill_tokens=args.local_prefill_tokens,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(
        f"SERVING router=127.0.0.1:{cluster.port} metrics=127.0.0.1:{cluster.router.metrics_port} workers="
        + ",".join(f"{w.name}@{w.address}" for w in cluster.workers),
        flush=True,
    )
    print(
        f"send a request: baton client generate --addr 127.0.0.1:{cluster.port} "
        '--prompt "Tell me about relay races." --max-tokens 16 --json',
        flush=True,
    )
    if cluster.router.http_port is not None:
        print(
            f"or over HTTP: curl -s 127.0.0.1:{cluster.router.http_port}/v1/completions "
            """-H 'Content-Type: application/json' -d '{"prompt": "Tell me about relay races.", """
            """"max_tokens": 16}'""",
            flush=True,
        )
    stop.wait()
    cluster.stop()
    return 0


def _disaggregation(args: argparse.Namespace) -> str:
    if args.colocated and args.always_disaggregate:
        raise ValueError("--colocated and --always-disaggregate: choose one")
    if args.local_prefill_tokens < 0:
        raise ValueError("--local-prefill-tokens: must be >= 0")
    return "never" if args.colocated else "always" if args.always_disaggregate else "conditional"
