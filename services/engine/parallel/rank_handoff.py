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

Each rank plans its own part (``handoff_plan.plan_handoff(..., senders=[rank])``: which byte runs of its
pools go to which decode rank; the plan is a pure function of the command, so the ranks agree without
sending it), copies its runs, in order, into its registered staging buffer (``kernels/byte_runs``: one
Triton launch per region on CUDA, no per-byte index; the torch reference on the CPU; a window of the
buffer's size at a time) and writes runs of it into each decode rank's pools with
``TransferBackend.write_bytes`` (one write per decode rank). A rank's failure is reported, not raised:
the group stays in step (the followers are back at the control group for the next step), and rank 0
fails the handoff (``TransferError``) naming the ranks."""

import time
from dataclasses import dataclass

import torch

from common.errors import TransferError
from kernels.byte_runs import naive, triton_copy
from services.engine.cache_manager import CacheManager
from services.engine.model.config import ModelConfig
from services.transfer import BLOCKS, STATE, TransferBackend, TransferEndpoint, make_backend
from services.transfer.byte_plan import ByteSpan

from ..handoff_checksum import settled, span_address, spans_checksum
from .handoff_plan import HandoffRequestRows, HandoffSide, landing_spans, plan_handoff
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
        checksum_key: hash the bytes written under this key (``handoff_checksum.spans_checksum``);
            None: no checksum.
    """

    request_id: str
    prefill: HandoffSide
    decode: HandoffSide
    rows: HandoffRequestRows
    endpoints: tuple[TransferEndpoint, ...]
    timeout_s: float
    checksum_key: int | None = None


@dataclass(frozen=True)
class RankSent:
    """One rank's report: ``nbytes`` written in ``seconds``, or ``error`` (empty when it succeeded);
    ``checksum``: the span checksum of its writes (0 when none was asked for)."""

    rank: int
    nbytes: int
    seconds: float
    error: str = ""
    checksum: int = 0


@dataclass(frozen=True)
class LandedCheck:
    """Rank 0 -> followers of a decode group: hash what a handoff filled in your pools
    (``landed_checksum``).

    Attributes:
        decode: this group's side.
        num_tokens, block_ids, slot, held_tokens: the reservation (``handoff_plan.landing_spans``).
        key: the checksum key (the reservation's capability's).
    """

    decode: HandoffSide
    num_tokens: int
    block_ids: tuple[int, ...]
    slot: int
    held_tokens: int
    key: int


def landed_checksum(
    model: ModelConfig, storages: dict[str, torch.Tensor], check: LandedCheck, rank: int
) -> int:
    """Decode rank ``rank``'s share of a parallel handoff's checksum: its landing spans in ``storages``
    (``BLOCKS`` and ``STATE``: its pools' storages), by their span addresses. Waits for the value."""
    spans = landing_spans(
        model, check.decode, rank, check.num_tokens, check.block_ids, check.slot, check.held_tokens
    )
    partials = [
        spans_checksum(
            storages[region].view(-1), offsets, span_address(rank, region, offsets), nbytes, check.key
        )
        for region, (offsets, nbytes) in spans.items()
    ]
    return settled(partials)


STAGING_MAX_BYTES = 64 << 20  # a rank's staging buffer at most (a longer part is sent in windows)
_VECTOR = 16  # the staging buffer's size is a multiple of this


def staging_bytes_for(cache: CacheManager, max_model_len: int) -> int:
    """A rank's staging buffer: what it holds of a longest request (every block of a longest context
    and one state slot: a plan stages each byte once, so no part is larger), at most
    ``STAGING_MAX_BYTES``; a longer part goes in several windows (``RankTransfer``)."""
    blocks = -(-max_model_len // cache.block_tokens)
    held = blocks * cache.blocks.storage.shape[1] + cache.slots.storage.shape[1]
    # whole 16-byte vectors: aligned runs stay aligned in every window (the gather's word path)
    return min(STAGING_MAX_BYTES, -(-held // _VECTOR) * _VECTOR)


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
        self.storages = {BLOCKS: blocks, STATE: state}
        for region, storage in self.storages.items():
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
            if len(command.endpoints) != command.decode.parallel.world_size:
                ranks = command.decode.parallel.world_size
                raise ValueError(f"{len(command.endpoints)} decode endpoints for {ranks} ranks")
            sides = command.prefill, command.decode
            plan = plan_handoff(self._model, *sides, command.rows, senders=[rank])[rank]
            nbytes, checksum = self._send(plan, command)
        except Exception as error:  # noqa: BLE001 (any failure: reported, see the docstring)
            return RankSent(rank, 0, time.perf_counter() - start, f"{type(error).__name__}: {error}")
        return RankSent(rank, nbytes, time.perf_counter() - start, checksum=checksum)

    def close(self) -> None:
        self.backend.close()

    def _send(self, plan: RankSend, command: HandoffCommand) -> tuple[int, int]:
        """Run ``plan`` one staging window at a time: the plan's staging offsets may pass the buffer's
        size (a context longer than the buffer holds), so window ``k`` gathers the runs' bytes that fall
        in ``[k W, (k+1) W)``, hashes the plan's ``hashed`` spans of them (with a ``checksum_key``) and,
        once the gather has run on the device (NIXL does not follow the stream's order; the hash may
        still be running), makes every write of them (several decode ranks' writes may read the same
        staged bytes) before the next window's gather.
        Returns the bytes written and their checksum (0 without a key)."""
        if plan.staging_nbytes == 0:
            return 0, 0
        if self.staging is None:
            raise TransferError("this rank has no staging buffer (its pools were registered to receive only)")
        staging, window = self.staging.view(-1), self.staging.shape[1]
        gathers, position = [], 0
        for runs in plan.gather:
            lengths = runs.nbytes.to(torch.int64)
            gathers.append((runs.region, runs.offsets.to(torch.int64), position + _starts(lengths), lengths))
            position += int(lengths.sum())
        nbytes, partials = 0, []
        for low in range(0, plan.staging_nbytes, window):
            high = min(low + window, plan.staging_nbytes)
            for region, offsets, at, lengths in gathers:
                offsets, at, lengths = _clip(offsets, at, lengths, low, high)
                source = self.storages[region].view(-1)
                copy_runs = triton_copy.copy_byte_runs if source.is_cuda else naive.copy_byte_runs
                copy_runs(source, offsets, staging, at - low, lengths)
            gathered = _recorded(staging)
            if command.checksum_key is not None:  # queued behind the gather, before the next one
                partials.extend(_window_checksums(plan, staging, low, high, command.checksum_key))
            if gathered is not None:  # NIXL reads the staging buffer outside the stream's order
                gathered.synchronize()
            for decode_rank, spans in _window_spans(plan, low, high).items():
                peer = self.backend.connect(command.endpoints[decode_rank])
                nbytes += self.backend.write_bytes(peer, spans, timeout_s=command.timeout_s).nbytes
        return nbytes, settled(partials)


def _recorded(tensor: torch.Tensor) -> "torch.cuda.Event | None":
    """An event recorded on ``tensor``'s device stream now (what is queued so far), or None on the CPU."""
    if not tensor.is_cuda:
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(tensor.device))
    return event


def _starts(lengths: torch.Tensor) -> torch.Tensor:
    """Where each of consecutive runs of ``lengths`` starts, from 0."""
    return torch.cumsum(lengths, 0) - lengths


def _clip(
    offsets: torch.Tensor, at: torch.Tensor, lengths: torch.Tensor, low: int, high: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The parts of runs (``offsets`` in their source, ``at`` in staging, ``lengths``) whose staging
    bytes fall in ``[low, high)``: ``(offsets, at, lengths)`` of the non-empty parts."""
    begin, end = at.clamp(min=low), (at + lengths).clamp(max=high)
    keep = begin < end
    return (offsets + begin - at)[keep], begin[keep], (end - begin)[keep]


def _window_checksums(
    plan: RankSend, staging: torch.Tensor, low: int, high: int, key: int
) -> list[torch.Tensor]:
    """The span checksums (partial sums) of the plan's ``hashed`` runs whose staging bytes fall in
    ``[low, high)``, read from ``staging`` (the window's gathered bytes), by where they land."""
    partials = []
    for run in plan.hashed:
        remote, at, lengths = _clip(run.remote_offsets, run.staging_offsets, run.nbytes, low, high)
        if len(lengths):
            addresses = span_address(run.decode_rank, run.region, remote)
            partials.append(spans_checksum(staging, at - low, addresses, lengths, key))
    return partials


def _window_spans(plan: RankSend, low: int, high: int) -> dict[int, list[ByteSpan]]:
    """The plan's writes of staging bytes ``[low, high)`` as byte spans from the staging buffer,
    grouped by decode rank."""
    spans: dict[int, list[ByteSpan]] = {}
    for write in plan.writes:
        remote, at, lengths = _clip(
            write.remote_offsets.to(torch.int64),
            write.staging_offsets.to(torch.int64),
            write.nbytes.to(torch.int64),
            low,
            high,
        )
        runs = zip((at - low).tolist(), remote.tolist(), lengths.tolist(), strict=True)
        spans.setdefault(write.decode_rank, []).extend(
            ByteSpan(STAGING, local, write.region, offset, size) for local, offset, size in runs
        )
    return {rank: rank_spans for rank, rank_spans in spans.items() if rank_spans}
