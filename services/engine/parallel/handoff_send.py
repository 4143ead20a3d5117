"""One prefill rank's part of a handoff: gather local byte runs into a staging buffer, then write runs
of it into decode ranks' regions (``RankSend``), built from a plan's elementary copies with runs
coalesced on both sides; and ``apply_plan_reference``, which executes sends with plain torch indexing.

    prefill rank's regions          staging (decode order)           decode ranks' regions
    blocks |..aa..bb....cc..|  -->  | aa bb cc | s1 s2 |  -->  rank 0 blocks |....aabbcc....|
    state  |....s1..s2......|  gather                writes       rank 0 state  |..s1s2..|

Offsets are bytes into a region's flat storage (``BlockPool.storage`` / ``StateSlotPool.storage``);
regions are named as ``services.transfer`` names them.
"""

from collections.abc import Collection
from dataclasses import dataclass

import torch

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
    (remote offsets into the decode rank's flat region). Empty when the rank sends nothing."""

    gather: tuple[ByteRuns, ...]
    writes: tuple[RemoteWrite, ...]
    staging_nbytes: int


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
            [local[runs.region][_byte_index(runs.offsets, runs.nbytes)] for runs in send.gather]
        )
        for write in send.writes:
            remote = dict(
                zip(REGIONS, (pool.view(-1) for pool in decode_pools[write.decode_rank]), strict=True)
            )
            target = _byte_index(write.remote_offsets, write.nbytes)
            remote[write.region][target] = staging[_byte_index(write.staging_offsets, write.nbytes)]


def _byte_index(offsets: torch.Tensor, nbytes: torch.Tensor) -> torch.Tensor:
    """``[sum(nbytes)]`` int64: the byte positions of runs ``offsets[i] .. offsets[i] + nbytes[i]``."""
    starts = torch.cumsum(nbytes, 0) - nbytes
    return torch.repeat_interleave(offsets - starts, nbytes) + torch.arange(int(nbytes.sum()))


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
    ) -> None:
        """Copies ``nbytes[i]`` bytes at ``source[i]`` on prefill rank ``sender`` to ``target[i]`` of
        ``decode_rank``'s ``region`` (int64 ``[N]`` each)."""
        if sender not in self.senders:
            return
        groups = self._parts.setdefault(sender, {})
        columns = groups.setdefault((REGIONS.index(region), decode_rank), ([], [], []))
        for column, piece in zip(columns, (source, target, nbytes), strict=True):
            column.append(piece)

    def rank_send(self, rank: int) -> RankSend:
        """``rank``'s copies staged in destination order (region, decode rank, offset), coalesced."""
        groups = self._parts.get(rank, {})
        staged, writes, by_region = 0, [], {}
        for code, decode_rank in sorted(groups):
            source, target, nbytes = (torch.cat(column) for column in groups[code, decode_rank])
            order = torch.argsort(target)  # the targets are disjoint ranges
            source, target, nbytes = source[order], target[order], nbytes[order]
            staging = staged + torch.cumsum(nbytes, 0) - nbytes
            staged += int(nbytes.sum())
            starts, run_bytes = _runs(target[:-1] + nbytes[:-1] == target[1:], staging, staged)
            writes.append(RemoteWrite(decode_rank, REGIONS[code], staging[starts], target[starts], run_bytes))
            by_region.setdefault(code, []).append((source, nbytes, staging))
        gather = []
        for code, parts in by_region.items():
            source, nbytes, staging = (torch.cat(column) for column in zip(*parts, strict=True))
            end = int(staging[-1] + nbytes[-1])
            starts, run_bytes = _runs(source[:-1] + nbytes[:-1] == source[1:], staging, end)
            gather.append(ByteRuns(REGIONS[code], source[starts], run_bytes))
        return RankSend(tuple(gather), tuple(writes), staged)


def _runs(joins: torch.Tensor, staging: torch.Tensor, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(start item, bytes)`` of each run, where ``joins[i]`` says item ``i + 1`` continues item ``i``'s
    run; the items lie back to back in the staging buffer (at ``staging``, up to ``end``)."""
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), torch.nonzero(~joins)[:, 0] + 1])
    ends = torch.cat([staging[starts[1:]], torch.tensor([end])])
    return starts, ends - staging[starts]
