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
    parser.add_argument("--prefill-workers", type=int, default=1)
    parser.add_argument("--decode-workers", type=int, default=1)
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
        f"send a request: baton client generate --addr 127.0.0.1:{cluster.port} --prompt-ids 1,2,3 "
        "--max-tokens 8 --json",
        flush=True,
    )
    stop.wait()
    cluster.stop()
    return 0
