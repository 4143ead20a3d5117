"""``RankGroup``: one engine's ranks as processes, rank 0 in the calling process.

An engine whose layout has ``world_size`` ranks (``EngineConfig.world_size``) runs as that many
processes on one host: rank 0 is the process that built the engine (``baton worker``, ``baton
generate``, a Ray worker actor) and runs the scheduler, the sampler and every API; ranks 1..N-1 are
followers (``follower.py``) it starts here, each loading its own shard and running every forward rank 0
broadcasts (``rank_step.py``)::

    rank 0 (this process)                     followers (python -m services.engine.parallel.follower)
      TCPStore on a free port  ──port──►        connect to it
      init_process_group (gloo | nccl)  ◄──►    init_process_group
      groups per dimension + a gloo control group (the steps)
      load shard 0, engine loop                 load shard k, loop: receive step -> forward

Failure is all or nothing. A watchdog thread here polls the followers: when one exits while the group
is up, it prints which rank died to stderr, kills the others and ends this process with
``EXIT_GROUP_DOWN`` (a supervisor then restarts the whole group: ``deploy/local/launcher.py``, Kubernetes
or Ray). A follower goes when rank 0 does: the kernel kills it (``PR_SET_PDEATHSIG``, Linux) and its
own watchdog ends it within a second besides (``follower.py``).
``close`` stops the followers in order (a stop message, then a kill after ``STOP_TIMEOUT_S``).

Devices: on CUDA rank ``r`` uses ``cuda:(base + r)`` (``base`` from ``--device cuda:N``), one per rank,
with NCCL; on the CPU every rank uses gloo.
"""

import atexit
import ctypes
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist

from services.engine.engine_config import EngineConfig

from .context import ParallelContext, build_parallel_context
from .rank_step import RankStep, gather_answers, send_step

log = logging.getLogger(__name__)

EXIT_GROUP_DOWN = 3  # a rank died: the group went down with it
STOP_TIMEOUT_S = 10.0  # how long followers get to leave after the stop message
WATCH_INTERVAL_S = 0.2
# Model collectives: a rank still waiting after this long means another is stuck or gone.
COLLECTIVE_TIMEOUT = timedelta(minutes=5)
# The control group's broadcast waits for rank 0's next step, however long the engine stays idle;
# a dead rank 0 is noticed by the followers' watchdog, not by this timeout.
IDLE_TIMEOUT = timedelta(days=365)
REPO = Path(__file__).resolve().parents[3]


PR_SET_PDEATHSIG = 1


def _parent_death_signal():
    """Linux's ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, looked up before any fork (None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


# Run in each follower between fork and exec: the kernel kills it the moment rank 0's spawning thread
# ends, even while it is still importing (its own watchdog, ``follower.py``, starts only after that).
_kill_when_parent_dies = _parent_death_signal()


def rank_device(config: EngineConfig, rank: int) -> str:
    """The device of ``rank``: ``cpu``, or ``cuda:(base + rank)``."""
    kind, _, index = config.device.partition(":")
    return f"cuda:{int(index or 0) + rank}" if kind == "cuda" else "cpu"


@dataclasses.dataclass(frozen=True)
class RankMembership:
    """What a rank holds once it has joined: its context (groups per dimension) and the control group."""

    context: ParallelContext
    control: dist.ProcessGroup


def join_group(config: EngineConfig, rank: int, store: dist.Store) -> RankMembership:
    """Initialise torch.distributed for ``rank`` over ``store`` and build the groups (collective: every
    rank calls it)."""
    device = rank_device(config, rank)
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=config.world_size, timeout=COLLECTIVE_TIMEOUT
    )
    context = build_parallel_context(config.layout)
    control = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    return RankMembership(context, control)


def config_json(config: EngineConfig) -> str:
    """``config`` as the JSON a follower reads back with ``config_from_json``."""
    return json.dumps(dataclasses.asdict(config))


def config_from_json(text: str) -> EngineConfig:
    values = json.loads(text)
    values["adapters"] = tuple(values["adapters"])
    return EngineConfig(**values)


class RankGroup:
    """Rank 0's side of the group: starts the followers and joins with them (see the module docstring).

    Build it on a thread that lives as long as the engine (the main thread, an actor's): the kernel ends
    the followers when their spawning thread ends. A follower that exits before it has joined (a bad
    checkpoint, say: its error is on stderr) takes this process down like one that dies later.

    Args:
        config: the engine; ``world_size > 1``, already checked (``parallel_check.check_parallel``).
    """

    def __init__(self, config: EngineConfig):
        self.config = config
        self.world_size = config.world_size
        self._closing = threading.Event()
        store = dist.TCPStore("127.0.0.1", 0, self.world_size, is_master=True, wait_for_workers=False)
        self.followers = [self._spawn(rank, store.port) for rank in range(1, self.world_size)]
        self._watchdog = threading.Thread(target=self._watch, name="rank-watchdog", daemon=True)
        self._watchdog.start()
        atexit.register(self.close)
        self.membership = join_group(config, 0, store)
        self._store = store  # kept alive: the followers' store connections point here

    @property
    def context(self) -> ParallelContext:
        return self.membership.context

    def send(self, step: RankStep) -> None:
        """Broadcast one step to the followers (they run its forward beside rank 0's)."""
        send_step(step, self.membership.control)

    def ask(self, message: object, own_answer: Callable[[], object]) -> list:
        """Broadcast a handoff message (``rank_handoff.py``), compute rank 0's answer with ``own_answer``
        meanwhile, and return every rank's answer in rank order (a follower's comes after its part)."""
        send_step(message, self.membership.control)
        return gather_answers(own_answer(), self.membership.control)

    def close(self) -> None:
        """Stop the followers (the stop message, then a kill after ``STOP_TIMEOUT_S``) and leave the
        group. Idempotent."""
        if self._closing.is_set():
            return
        self._closing.set()
        try:
            if all(process.poll() is None for process in self.followers):
                send_step(None, self.membership.control)
        except Exception as error:  # a broken group: the followers are killed below
            log.warning("rank group: stop message not sent (%s)", error)
        for process in self.followers:
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if dist.is_initialized():
            dist.destroy_process_group()

    def _spawn(self, rank: int, port: int) -> subprocess.Popen:
        search_path = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
        command = [sys.executable, "-m", "services.engine.parallel.follower", "--rank", str(rank)]
        command += ["--store-port", str(port), "--config", config_json(self.config)]
        command += ["--parent-pid", str(os.getpid())]
        # stdout is rank 0's alone (a worker's READY line); a follower's goes to this process's fd 2
        # (the descriptor itself: ``sys.stderr`` may be a capture without one).
        return subprocess.Popen(
            command,
            env={**os.environ, "PYTHONPATH": search_path},
            stdout=2,
            preexec_fn=_kill_when_parent_dies,
        )

    def take_down(self, reason: str) -> NoReturn:
        """End the whole group now: print ``reason``, kill the followers, exit with ``EXIT_GROUP_DOWN``.

        For what leaves the ranks out of step (a rank died, rank 0's forward failed half way through its
        collectives): going on would pair later collectives with the wrong ones.
        """
        print(f"baton: {reason}; taking the rank group down", file=sys.stderr, flush=True)
        for process in self.followers:
            if process.poll() is None:
                process.kill()
        os._exit(EXIT_GROUP_DOWN)

    def _watch(self) -> None:
        while not self._closing.wait(WATCH_INTERVAL_S):
            for rank, process in enumerate(self.followers, start=1):
                code = process.poll()
                if code is not None and not self._closing.is_set():
                    how = f"signal {-code}" if code < 0 else f"exit code {code}"
                    self.take_down(f"rank {rank} of {self.world_size} (pid {process.pid}) died ({how})")
