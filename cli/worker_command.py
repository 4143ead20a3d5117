"""``baton worker``: run one prefill or decode worker process (the launcher starts these)."""

import argparse
import os
import signal
import threading
from collections.abc import Mapping
from pathlib import Path

from services.config_flags import add_config_flags, given_flags
from services.engine.engine_config import EngineConfig
from services.worker_config import ENV_PREFIX, WorkerConfig, load_worker_config
from services.worker_server import WorkerServer


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "worker",
        help="run one prefill or decode worker (gRPC)",
        description="Settings come from --config FILE (YAML; engine fields under engine:), then "
        f"{ENV_PREFIX}<FIELD> environment variables (e.g. {ENV_PREFIX}KV_FORMAT=fp8), then the flags "
        "below, later ones winning field by field. --role and --model are required from one of them.",
    )
    parser.add_argument(
        "--config", type=Path, help="a YAML worker config (WorkerConfig fields; engine fields under engine:)"
    )
    add_config_flags(parser, WorkerConfig, suppress=True)
    add_config_flags(parser.add_argument_group("engine"), EngineConfig, suppress=True)
    parser.add_argument(
        "--exit-with-parent", action="store_true", help="stop when the starting process exits"
    )
    parser.set_defaults(run=run)


def config_from(args: argparse.Namespace, env: Mapping[str, str] = os.environ) -> WorkerConfig:
    """The ``WorkerConfig`` of ``--config``, the environment and the flags given (later wins)."""
    flags = {**given_flags(args, WorkerConfig), **given_flags(args, EngineConfig)}
    return load_worker_config(args.config, env, flags)


def run(args: argparse.Namespace) -> int:
    config = config_from(args)
    server = WorkerServer(config)
    stop, hurry = threading.Event(), threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # The first signal starts the drain; a second one ends its wait.
        signal.signal(sig, lambda *_: hurry.set() if stop.is_set() else stop.set())
    if args.exit_with_parent:
        threading.Thread(target=watch_parent, args=(os.getppid(), stop), daemon=True).start()
    print(
        f"READY role={config.role} name={server.name} metrics_port={server.metrics_port} port={server.port}",
        flush=True,
    )
    stop.wait()
    server.drain(hurry)
    server.stop()
    return 0


def watch_parent(parent: int, stop: threading.Event) -> None:
    """Set ``stop`` once this process is re-parented (its launcher died without stopping it)."""
    while not stop.wait(1.0):
        if os.getppid() != parent:
            stop.set()
