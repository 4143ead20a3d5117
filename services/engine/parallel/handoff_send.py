"""One prefill rank's part of a handoff: gather local byte runs into a staging buffer, then write runs
of it into decode ranks' regions (``RankSend``), built from a plan's elementary copies with runs
coalesced on both sides; and ``apply_plan_reference``, which executes sends with plain torch indexing.
Bytes several decode ranks need (an MLA row is whole on every decode TP rank) are staged once, and
those ranks' writes read the same staging offsets::

    prefill rank's regions          staging (decode order)           decode ranks' regions
    blocks |..aa..bb....cc..|  -->  | aa bb cc | s1 s2 |  -->  rank 0 blocks |....aabbcc....|
    state  |....s1..s2......|  gather           | writes  +-->  rank 1 blocks |..aabbcc......|
                                                          +-->  rank 0 state  |..s1s2..|

Offsets are bytes into a region's flat storage (``BlockPool.storage`` / ``StateSlotPool.storage``);
regions are named as ``services.transfer`` names them.
"""

from collections.abc import Collection
from dataclasses import dataclass

import torch

from kernels.byte_runs.naive import byte_index, copy_byte_runs
from services.transfer import BLOCKS, STATE

REGIONS = (BLOCKS, STATE)  # a region's code (its index) while building sends


@dataclass(frozen=True)
class ByteRuns:
    """Byte ranges ``offsets[i] .. offsets[i] + nbytes[i]`` of one region (int64 CPU tensors ``[N]``)."""

    region: str
    offsets: torch.Tensor
    nbytes: torch.Tensor


@dataclass(frozen=True)
class RemoteWrite:
    """Runs of the staging buffer written into one region of one decode rank (int64 CPU ``[N]`` each)."""

    decode_rank: int
    region: str
    staging_offsets: torch.Tensor
    remote_offsets: torch.Tensor
    nbytes: torch.Tensor


@dataclass(frozen=True)
class RankSend:
    """What one prefill rank does: concatenate its ``gather`` runs, in order, into a staging buffer of
    ``staging_nbytes`` bytes (offsets into a region's flat ``storage``), then make the ``writes``
    (remote offsets into the decode rank's flat region). Each source byte is staged at most once, so
    ``staging_nbytes`` is at most what the rank holds; writes to several decode ranks may read the same
    staging range. Empty when the rank sends nothing. ``hashed``: the writes' bytes that hold state
    (without the alignment padding a whole field's copy takes along), what the handoff checksum covers
    (``handoff_plan.landing_spans`` is the same bytes seen from the decode side)."""

    gather: tuple[ByteRuns, ...]
    writes: tuple[RemoteWrite, ...]
    staging_nbytes: int
    hashed: tuple[RemoteWrite, ...] = ()


def apply_plan_reference(
    plan: dict[int, RankSend],
    prefill_pools: dict[int, tuple[torch.Tensor, torch.Tensor]],
    decode_pools: dict[int, tuple[torch.Tensor, torch.Tensor]],
) -> None:
    """Run ``plan`` with plain torch indexing: the reference the tests (and a CPU fallback) use.

    Args:
        plan: ``plan_handoff``'s result.
        prefill_pools / decode_pools: rank -> ``(blocks, state)`` contiguous uint8 storages
            (``BlockPool.storage``, ``StateSlotPool.storage``); the decode ones are written in place.
    """
    for rank, send in sorted(plan.items()):
        if not send.gather:
            continue
        local = dict(zip(REGIONS, (pool.view(-1) for pool in prefill_pools[rank]), strict=True))
        staging = torch.cat(
            [local[runs.region][byte_index(runs.offsets, runs.nbytes)] for runs in send.gather]
        )
        for write in send.writes:
            remote = dict(
                zip(REGIONS, (pool.view(-1) for pool in decode_pools[write.decode_rank]), strict=True)
            )
            copy_byte_runs(
                staging, write.staging_offsets, remote[write.region], write.remote_offsets, write.nbytes
            )


class SendBuilder:
    """Collects a plan's elementary copies (prefill rank, region, decode rank, source offset, decode
    offset, bytes), each decode byte in one copy, and turns one rank's into its ``RankSend``."""

    def __init__(self, senders: Collection[int]):
        """Keeps the copies of ``senders`` only (the others' are dropped as they come)."""
        self.senders = frozenset(senders)
        # sender -> (region code, decode rank) -> int64 [N] pieces of the source, target, bytes columns
        self._parts: dict[int, dict[tuple[int, int], tuple[list[torch.Tensor], ...]]] = {}

    def add(
        self,
        sender: int,
        region: str,
        decode_rank: int,
        source: torch.Tensor,
        target: torch.Tensor,
        nbytes: torch.Tensor,
        hashed: torch.Tensor | None = None,
    ) -> None:
        """Copies ``nbytes[i]`` bytes at ``source[i]`` on prefill rank ``sender`` to ``target[i]`` of
        ``decode_rank``'s ``region`` (int64 ``[N]`` each), of which the first ``hashed[i]`` hold state
        (default: all; fewer when a whole field's copy takes its alignment padding along)."""
        if sender not in self.senders:
            return
        groups = self._parts.setdefault(sender, {})
        columns = groups.setdefault((REGIONS.index(region), decode_rank), ([], [], [], []))
        pieces = (source, target, nbytes, nbytes if hashed is None else hashed)
        for column, piece in zip(columns, pieces, strict=True):
            column.append(piece)

    def rank_send(self, rank: int) -> RankSend:
        """``rank``'s copies staged in destination order (region, decode rank, offset), each source range
        once: a copy of bytes an earlier copy already staged (an MLA row every decode TP rank needs)
        writes from that copy's staging offsets. Runs are coalesced on both sides."""
        groups = self._parts.get(rank, {})
        staged, writes, hashed, by_region = 0, [], [], {}
        for code in sorted({code for code, _ in groups}):
            ranks = sorted(decode_rank for group_code, decode_rank in groups if group_code == code)
            columns = []
            for decode_rank in ranks:
                source, target, nbytes, holds = (torch.cat(column) for column in groups[code, decode_rank])
                order = torch.argsort(target)  # the targets are disjoint ranges
                columns.append((source[order], target[order], nbytes[order], holds[order]))
            source, nbytes = (torch.cat([c[i] for c in columns]) for i in (0, 2))
            if not len(source):
                continue
            first, fresh = _first_copies(source, nbytes)
            start = staged + torch.cumsum(nbytes * fresh, 0) - nbytes * fresh
            staging = start[first]  # a repeated copy reads where its first one was staged
            staged = int(start[-1] + nbytes[-1] * fresh[-1])
            at = 0
            for decode_rank, (_, target, run_nbytes, holds) in zip(ranks, columns, strict=True):
                rank_staging, at = staging[at : at + len(target)], at + len(target)
                for runs, sizes in ((writes, run_nbytes), (hashed, holds)):
                    runs.append(_coalesced(decode_rank, REGIONS[code], rank_staging, target, sizes))
            by_region[code] = (source[fresh], nbytes[fresh])  # back to back in staging, in order
        gather = []
        for code, (source, nbytes) in by_region.items():
            starts, run_bytes = _joined(source[:-1] + nbytes[:-1] == source[1:], nbytes)
            gather.append(ByteRuns(REGIONS[code], source[starts], run_bytes))
        return RankSend(tuple(gather), tuple(writes), staged, tuple(hashed))


def _coalesced(
    decode_rank: int, region: str, staging: torch.Tensor, target: torch.Tensor, nbytes: torch.Tensor
) -> RemoteWrite:
    """Copies of ``nbytes`` from ``staging`` offsets to ``target`` offsets (in target order) as runs,
    joined where both sides continue."""
    joins = (target[:-1] + nbytes[:-1] == target[1:]) & (staging[:-1] + nbytes[:-1] == staging[1:])
    starts, run_bytes = _joined(joins, nbytes)
    return RemoteWrite(decode_rank, region, staging[starts], target[starts], run_bytes)


def _first_copies(source: torch.Tensor, nbytes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first, fresh)``: for each copy, the index of the first copy of the same ``(source, nbytes)``
    (int64 ``[N]``), and whether it is that first one (bool ``[N]``)."""
    pairs, inverse = torch.unique(torch.stack([source, nbytes], 1), dim=0, return_inverse=True)
    positions = torch.arange(len(source))
    first_of_pair = torch.full((len(pairs),), len(source), dtype=torch.int64)
    first_of_pair = first_of_pair.scatter_reduce(0, inverse, positions, "amin")
    first = first_of_pair[inverse]
    return first, first == positions


def _joined(joins: torch.Tensor, nbytes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(start item, bytes)`` of each run, where ``joins[i]`` says item ``i + 1`` continues item ``i``'s
    run (``nbytes``: each item's bytes)."""
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), torch.nonzero(~joins)[:, 0] + 1])
    ends = torch.cat([starts[1:], torch.tensor([len(nbytes)])])
    totals = torch.cumsum(torch.cat([torch.zeros(1, dtype=torch.int64), nbytes]), 0)
    return starts, totals[ends] - totals[starts]
