"""A parallel engine's handoff, rank by rank: every rank's own transfer agent, and one request's state
sent by each prefill rank straight to the decode ranks that own it (no gather on one rank).

Two messages ride on the gloo control group beside ``RankStep`` (``rank_step.py``), each answered by
every follower to rank 0 (``gather_object``)::

    rank 0 (engine loop thread)                      follower k
    TransferSetup(backend, agent name)   ─────────►  own backend "<agent>-rank<k>": blocks, state, staging
                                         ◄─────────  its TransferEndpoint
    HandoffCommand(request rows, both sides, decode endpoints)
      own part: plan -> gather -> write_bytes        plan its part, gather into staging, write_bytes
                                         ◄─────────  RankSent(bytes, seconds, error)

Each rank plans its own part (``handoff_plan.plan_handoff(..., senders=[rank])``: which byte runs of
its pools go to which decode rank; the plan is a pure function of the command, so the ranks agree
without sending it), copies its runs, in order, into its registered staging buffer (one indexed copy
per region) and writes runs of it into each decode rank's pools with ``TransferBackend.write_bytes``
(one write per decode rank). A rank's failure is reported, not raised: the group stays in step (the
followers are back at the control group for the next step), and rank 0 fails the handoff
(``TransferError``) naming the ranks.
"""

import time
from dataclasses import dataclass

import torch

from common.errors import TransferError
from services.engine.cache_manager import CacheManager
from services.engine.model.config import ModelConfig
from services.transfer import BLOCKS, STATE, TransferBackend, TransferEndpoint, make_backend
from services.transfer.byte_plan import ByteSpan

from .handoff_plan import HandoffRequestRows, HandoffSide, plan_handoff
from .handoff_send import RankSend

STAGING = "staging"  # a sending rank's staging buffer: its gathered runs, in plan order


@dataclass(frozen=True)
class TransferSetup:
    """Rank 0 -> followers: open your own transfer agent over your pools.

    Attributes:
        backend: the backend name (the worker's ``--transfer-backend``).
        agent_name: rank 0's agent; rank ``k``'s is ``"<agent_name>-rank<k>"``.
        staging_bytes: the staging buffer each rank registers (0: none, a group that only receives).
    """

    backend: str
    agent_name: str
    staging_bytes: int


@dataclass(frozen=True)
class HandoffCommand:
    """Rank 0 -> followers: send your part of one request's state.

    Attributes:
        request_id: the request (for errors; the notification is rank 0's to send).
        prefill, decode: the two groups' sides (``prefill`` is this group).
        rows: where the request is on both sides.
        endpoints: the decode group's endpoints, in its rank order.
        timeout_s: each rank's writes must complete within this.
    """

    request_id: str
    prefill: HandoffSide
    decode: HandoffSide
    rows: HandoffRequestRows
    endpoints: tuple[TransferEndpoint, ...]
    timeout_s: float


@dataclass(frozen=True)
class RankSent:
    """One rank's report: ``nbytes`` written in ``seconds``, or ``error`` (empty when it succeeded)."""

    rank: int
    nbytes: int
    seconds: float
    error: str = ""


def staging_bytes_for(cache: CacheManager, max_model_len: int) -> int:
    """Room for the most one request can send from one rank: every block of a longest context and one
    state slot (a rank never sends more than it holds)."""
    blocks = -(-max_model_len // cache.block_tokens)
    return blocks * cache.blocks.storage.shape[1] + cache.slots.storage.shape[1]


class RankTransfer:
    """One rank's transfer backend over its block and slot pools (and staging buffer).

    Args:
        backend: the rank's backend (rank 0: the worker's; a follower: its own, ``open_follower``).
        model: the model's config (what the plan lays the pools out from).
        blocks, state: the rank's block and slot pool storages (``BlockPool.storage``,
            ``StateSlotPool.storage``), registered as ``BLOCKS`` and ``STATE``.
        staging_bytes: the staging buffer to register (0: none), on the pools' device.
    """

    def __init__(
        self,
        backend: TransferBackend,
        model: ModelConfig,
        blocks: torch.Tensor,
        state: torch.Tensor,
        staging_bytes: int,
    ):
        self.backend = backend
        self._model = model
        self._storages = {BLOCKS: blocks, STATE: state}
        for region, storage in self._storages.items():
            backend.register(region, storage)
        self.staging = None
        if staging_bytes:
            self.staging = torch.zeros(1, staging_bytes, dtype=torch.uint8, device=blocks.device)
            backend.register(STAGING, self.staging)

    @classmethod
    def open_follower(
        cls, setup: TransferSetup, rank: int, model: ModelConfig, cache: CacheManager
    ) -> "RankTransfer":
        """A follower's own agent, named after rank 0's."""
        backend = make_backend(setup.backend, f"{setup.agent_name}-rank{rank}")
        return cls(backend, model, cache.blocks.storage, cache.slots.storage, setup.staging_bytes)

    def send(self, rank: int, command: HandoffCommand) -> RankSent:
        """Plan this rank's part, gather it into staging and write it to its decode ranks. Any error
        is reported in the ``RankSent``, never raised: a rank that raised here would leave the others
        waiting for its answer, out of step with rank 0's next message."""
        start = time.perf_counter()
        try:
            plan = plan_handoff(self._model, command.prefill, command.decode, command.rows, senders=[rank])[
                rank
            ]
            self._gather(plan)
            nbytes = 0
            for decode_rank, spans in _spans_by_rank(plan).items():
                peer = self.backend.connect(command.endpoints[decode_rank])
                nbytes += self.backend.write_bytes(peer, spans, timeout_s=command.timeout_s).nbytes
        except Exception as error:  # noqa: BLE001 (any failure: reported, see the docstring)
            return RankSent(rank, 0, time.perf_counter() - start, f"{type(error).__name__}: {error}")
        return RankSent(rank, nbytes, time.perf_counter() - start)

    def close(self) -> None:
        self.backend.close()

    def _gather(self, plan: RankSend) -> None:
        """Copy the plan's runs, in order, into the staging buffer (one indexed copy per region)."""
        if plan.staging_nbytes == 0:
            return
        if self.staging is None or plan.staging_nbytes > self.staging.shape[1]:
            room = 0 if self.staging is None else self.staging.shape[1]
            raise TransferError(f"the plan stages {plan.staging_nbytes} B, this rank has {room} B of staging")
        staging, position = self.staging.view(-1), 0
        for runs in plan.gather:
            lengths = runs.nbytes.to(torch.int64)
            total = int(lengths.sum())
            if total == 0:
                continue
            starts = runs.offsets.to(torch.int64) - (torch.cumsum(lengths, 0) - lengths)
            index = torch.repeat_interleave(starts, lengths) + torch.arange(total)
            source = self._storages[runs.region].view(-1)
            staging[position : position + total] = source[index.to(source.device)]
            position += total


def _spans_by_rank(plan: RankSend) -> dict[int, list[ByteSpan]]:
    """The plan's writes as byte spans from staging, grouped by decode rank."""
    spans: dict[int, list[ByteSpan]] = {}
    for write in plan.writes:
        runs = zip(
            write.staging_offsets.tolist(), write.remote_offsets.tolist(), write.nbytes.tolist(), strict=True
        )
        spans.setdefault(write.decode_rank, []).extend(
            ByteSpan(STAGING, local, write.region, remote, nbytes) for local, remote, nbytes in runs
        )
    return spans
