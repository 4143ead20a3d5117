"""Run a function on N spawned CPU ranks joined by one gloo process group; collect what each returns.

A test file spawns its ranks once (a module-scoped fixture) and runs every case inside that one group,
since starting processes and a group costs seconds on a small machine.
"""

import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank: int, size: int, port: int, out_dir: str, body: Callable, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # N ranks share the machine's cores
    dist.init_process_group("gloo", rank=rank, world_size=size)
    try:
        result = body(rank, size, *args)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_ranks(body: Callable, size: int, *args) -> list:
    """``body(rank, size, *args)`` on ``size`` processes inside one gloo group; their results, by rank.

    ``body`` must be importable (a module-level function); a rank that raises fails the call.
    """
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_rank_main, args=(size, _free_port(), out_dir, body, args), nprocs=size, join=True)
        return [torch.load(Path(out_dir) / f"rank{rank}.pt", weights_only=False) for rank in range(size)]
