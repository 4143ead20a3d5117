"""One prefill rank's part of a handoff: gather local byte runs into a staging buffer, then write runs
of it into decode ranks' regions (``RankSend``), built from a plan's elementary copies with runs
coalesced on both sides; and ``apply_plan_reference``, which executes sends with plain torch indexing.

    prefill rank's regions          staging (decode order)           decode ranks' regions
    blocks |..aa..bb....cc..|  -->  | aa bb cc | s1 s2 |  -->  rank 0 blocks |....aabbcc....|
    state  |....s1..s2......|  gather                writes       rank 0 state  |..s1s2..|

Offsets are bytes into a region's flat storage (``BlockPool.storage`` / ``StateSlotPool.storage``);
regions are named as ``services.transfer`` names them.
"""

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

    def __init__(self):
        self._parts: dict[int, list[torch.Tensor]] = {}

    def add(
        self,
        senders: torch.Tensor,
        region: str,
        decode_rank: int,
        source: torch.Tensor,
        target: torch.Tensor,
        nbytes: torch.Tensor,
    ) -> None:
        """Copies ``i`` from prefill rank ``senders[i]``; every argument tensor is int64 ``[N]`` (kept
        per sender as ``[5, N]`` columns: region code, decode rank, source, target, bytes)."""
        code = torch.full_like(source, REGIONS.index(region))
        columns = torch.stack([code, torch.full_like(source, decode_rank), source, target, nbytes])
        for sender in senders.unique().tolist():
            self._parts.setdefault(sender, []).append(columns[:, senders == sender])

    def rank_send(self, rank: int) -> RankSend:
        """``rank``'s copies in destination order (region, decode rank, offset), coalesced."""
        if rank not in self._parts:
            return RankSend((), (), 0)
        columns = torch.cat(self._parts[rank], dim=1)
        for key in (3, 1, 0):  # stable sorts, the last one primary
            columns = columns[:, torch.sort(columns[key], stable=True).indices]
        region, decode_rank, source, target, nbytes = columns
        staging = torch.cumsum(nbytes, 0) - nbytes
        total = int(nbytes.sum())
        same_region = region[1:] == region[:-1]
        gather = _runs(same_region & (source[:-1] + nbytes[:-1] == source[1:]), staging, total)
        same_rank = same_region & (decode_rank[1:] == decode_rank[:-1])
        writes = _runs(same_rank & (target[:-1] + nbytes[:-1] == target[1:]), staging, total)
        return RankSend(
            gather=tuple(
                ByteRuns(REGIONS[int(region[starts[0]])], source[starts], run_bytes)
                for starts, run_bytes in _split(region, *gather)
            ),
            writes=tuple(
                RemoteWrite(
                    int(decode_rank[starts[0]]),
                    REGIONS[int(region[starts[0]])],
                    staging[starts],
                    target[starts],
                    run_bytes,
                )
                for starts, run_bytes in _split(region * (int(decode_rank.max()) + 1) + decode_rank, *writes)
            ),
            staging_nbytes=total,
        )


def _runs(joins: torch.Tensor, staging: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(start item, bytes)`` of each run, where ``joins[i]`` says item ``i + 1`` continues item ``i``'s
    run; items lie back to back in the staging buffer (``staging``: their offsets, ``total`` bytes)."""
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), torch.nonzero(~joins)[:, 0] + 1])
    ends = torch.cat([staging[starts[1:]], torch.tensor([total])])
    return starts, ends - staging[starts]


def _split(
    key: torch.Tensor, starts: torch.Tensor, run_bytes: torch.Tensor
) -> list[tuple[torch.Tensor, ...]]:
    """Runs grouped by the (sorted) ``key`` of their start item: ``(starts, bytes)`` per key, in order. A run
    never crosses a key change (its joins require the same key)."""
    counts = torch.unique_consecutive(key[starts], return_counts=True)[1].tolist()
    return list(zip(torch.split(starts, counts), torch.split(run_bytes, counts), strict=True))
