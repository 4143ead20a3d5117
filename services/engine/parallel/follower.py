"""A follower rank: ``python -m services.engine.parallel.follower`` (started by ``RankGroup``, not by hand).

It joins rank 0's group, loads its shard of the model and builds its shard of the cache pools (the
same sizes as rank 0's), then runs every step rank 0 broadcasts until the stop message::

    receive RankStep -> apply its KDA state copies -> build StepMetadata -> forward (logits unused)

Between steps rank 0 may send a ``TransferSetup`` (open this rank's own transfer agent over its pools,
answer with its endpoint), a ``HandoffCommand`` (send this rank's part of a request's state, answer
with a ``RankSent``) or a ``LandedCheck`` (hash what a handoff filled in its pools):
``rank_handoff.py``. It never schedules or samples. A watchdog ends it (exit ``EXIT_GROUP_DOWN``)
within a second of rank 0 going away, whatever it is blocked in; an error in a step ends it too, which
rank 0's watchdog then turns into the whole group going down.
"""

import argparse
import os
import signal
import sys
import threading

import torch
import torch.distributed as dist

from services.engine.engine_config import EngineConfig

from .rank_group import EXIT_GROUP_DOWN, config_from_json, join_group, rank_device
from .rank_shard import RankShard
from .rank_step import RankStep, answer_rank_0, receive_step

PARENT_POLL_S = 0.5


def run_follower(config: EngineConfig, rank: int, store_port: int) -> None:
    """Join the group as ``rank``, then run rank 0's steps until it says stop."""
    store = dist.TCPStore("127.0.0.1", store_port, config.world_size, is_master=False)
    membership = join_group(config, rank, store)
    shard = RankShard(config, membership.context, rank_device(config, rank))
    try:
        with torch.no_grad():
            while (message := receive_step(membership.control)) is not None:
                if isinstance(message, RankStep):
                    shard.run(message)
                else:
                    answer_rank_0(shard.answer(message, rank), membership.control)
    finally:
        shard.close()
    dist.destroy_process_group()


def _exit_with_parent(parent: int) -> None:
    """End this process once rank 0 (its parent) is gone: it is re-parented then."""
    while True:
        if os.getppid() != parent:
            print(f"baton: rank 0 (pid {parent}) is gone; follower {os.getpid()} exits", file=sys.stderr)
            os._exit(EXIT_GROUP_DOWN)
        threading.Event().wait(PARENT_POLL_S)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--store-port", type=int, required=True)
    parser.add_argument("--config", required=True, help="the EngineConfig as JSON")
    parser.add_argument("--parent-pid", type=int, required=True, help="rank 0's process")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is rank 0's to handle
    # Given, not read here: rank 0 may already be gone (and this process re-parented) by now.
    threading.Thread(target=_exit_with_parent, args=(args.parent_pid,), daemon=True).start()
    run_follower(config_from_json(args.config), args.rank, args.store_port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
