"""``baton worker``: run one prefill or decode worker process (the launcher starts these)."""

import argparse
import os
import signal
import threading
from pathlib import Path

from services.engine.engine_config import EngineConfig
from services.worker_server import ROLES, WorkerConfig, WorkerServer

from .arguments import DTYPES, add_engine_kernel_flags


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("worker", help="run one prefill or decode worker (gRPC)")
    parser.add_argument("--role", required=True, choices=ROLES)
    parser.add_argument("--model", required=True, type=Path, help="checkpoint folder")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="listen port (default 0: any free port)")
    parser.add_argument("--name", default="", help="worker name in routes and stats")
    parser.add_argument("--transfer-backend", default="nixl", help="nixl or grpc_bytes (default nixl)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, choices=sorted(DTYPES))
    parser.add_argument("--batch-invariant", action="store_true")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument(
        "--metrics-port", type=int, default=0, help="/metrics port (default 0: any free port)"
    )
    parser.add_argument(
        "--fail-transfers",
        type=int,
        default=0,
        metavar="N",
        help="fault injection for tests and chaos drills: this prefill worker's first N handoffs fail",
    )
    parser.add_argument(
        "--reservation-ttl-s",
        type=float,
        default=600.0,
        metavar="S",
        help="decode: backstop: free a reservation still waiting for its state after S seconds, even if its "
        "router's lease looks alive (default 600)",
    )
    parser.add_argument(
        "--grace-period",
        type=float,
        default=30.0,
        metavar="S",
        help="on SIGTERM/SIGINT: admit nothing new (health NOT_SERVING) and give running requests and "
        "handoffs S seconds to finish; the router moves streams still running to another worker "
        "(default 30; a second signal ends the wait)",
    )
    parser.add_argument(
        "--release-grace-s",
        type=float,
        default=5.0,
        metavar="S",
        help="decode: a reservation whose router left waits up to S seconds for a handoff that may still "
        "be writing into it (default 5)",
    )
    parser.add_argument(
        "--fault-delay",
        action="append",
        default=[],
        metavar="PHASE=S",
        help="fault injection for tests and chaos drills: pause S seconds at PHASE (decode: reserve, "
        "decode_start; prefill: prefill, handoff); repeatable",
    )
    add_engine_kernel_flags(parser)
    parser.add_argument(
        "--exit-with-parent", action="store_true", help="stop when the starting process exits"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    engine = EngineConfig(
        model=str(args.model),
        device=args.device,
        dtype=args.dtype,
        batch_invariant=args.batch_invariant,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        kernels=args.kernels,
        cuda_graphs=args.cuda_graphs,
    )
    config = WorkerConfig(
        role=args.role,
        engine=engine,
        name=args.name,
        host=args.host,
        port=args.port,
        transfer_backend=args.transfer_backend,
        metrics_port=args.metrics_port,
        fail_transfers=args.fail_transfers,
        reservation_ttl_s=args.reservation_ttl_s,
        grace_period_s=args.grace_period,
        release_grace_s=args.release_grace_s,
        fault_delays=tuple(args.fault_delay),
    )
    server = WorkerServer(config)
    stop, hurry = threading.Event(), threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # The first signal starts the drain; a second one ends its wait.
        signal.signal(sig, lambda *_: hurry.set() if stop.is_set() else stop.set())
    if args.exit_with_parent:
        threading.Thread(target=_watch_parent, args=(os.getppid(), stop), daemon=True).start()
    print(
        f"READY role={args.role} name={server.name} metrics_port={server.metrics_port} port={server.port}",
        flush=True,
    )
    stop.wait()
    server.drain(hurry)
    server.stop()
    return 0


def _watch_parent(parent: int, stop: threading.Event) -> None:
    """Set ``stop`` once this process is re-parented (its launcher died without stopping it)."""
    while not stop.wait(1.0):
        if os.getppid() != parent:
            stop.set()
