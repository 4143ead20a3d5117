"""The DSA indexer's exact top-k when the index keys are split over the DCP ranks.

Each rank scores its own keys (token ``p`` on rank ``p % D``, ``DcpShard``); the global top-k must be
the single-rank one exactly: the same positions in the same order (score descending, then position
ascending). The exchange is candidates, then detect-and-refill (``kernels.dsa.topk_merge``)::

    round 1: all-gather [T, c] best candidates per rank (+ how many keys each holds)  -> merge
    detect:  a rank that held more than c and whose c-th candidate made the merged top-k
    round 2: only for those rows, all-gather each rank's best k                        -> merge

``c`` defaults to a rank's fair share ``k / D`` plus four standard deviations of how many of the
top-k land on one rank when keys are dealt out at random, so round 2 is rare (``ExchangeStats``
counts it). Round 2's row count is read on the host (every rank computes the same one from the same
gathered bytes), so the exchange is not CUDA-graph safe; ``candidates = k`` makes it one round,
exact, graph-shaped, at ``D`` times the bytes of the fair share.
"""

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from kernels.dsa.topk_merge import best_candidates, merge_candidates, needs_refill

from .collectives import all_gather_cat
from .dcp_shard import DcpShard


@dataclass
class ExchangeStats:
    """What the exchanges cost, summed over calls (per rank).

    Attributes:
        calls: top-k selections made.
        rounds: all-gathers made.
        refills: calls that needed round 2.
        refilled_rows: query rows exchanged again in round 2.
        bytes_sent: bytes this rank put into the all-gathers (it receives ``D - 1`` times as many).
    """

    calls: int = 0
    rounds: int = 0
    refills: int = 0
    refilled_rows: int = 0
    bytes_sent: int = 0


def default_candidates(topk: int, size: int) -> int:
    """What a rank sends in round 1: its share of ``topk`` plus four standard deviations (capped at k)."""
    share = topk / size
    return min(topk, math.ceil(share + 4 * math.sqrt(share)) + 1)


def _all_gather(
    group: dist.ProcessGroup, scores: torch.Tensor, positions: torch.Tensor, held: torch.Tensor, stats
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One all-gather of ``[T, c]`` scores and positions and ``[T]`` counts, packed as int32 bits."""
    packed = torch.cat([scores.view(torch.int32), positions, held[:, None].to(torch.int32)], dim=1)
    gathered = all_gather_cat(packed[None], group)  # [R, T, 2c + 1], in rank order
    sent = scores.shape[1]
    stats.rounds += 1
    stats.bytes_sent += packed.numel() * packed.element_size()
    return (
        gathered[..., :sent].contiguous().view(torch.float32),
        gathered[..., sent : 2 * sent],
        gathered[..., 2 * sent],
    )


def distributed_topk(
    scores: torch.Tensor,
    shard: DcpShard,
    group: dist.ProcessGroup,
    topk: int,
    candidates: int | None = None,
    stats: ExchangeStats | None = None,
) -> torch.Tensor:
    """The global top-k of index scores split over the DCP group; every rank gets the same result.

    Args:
        scores: ``[T, W]`` float32 this rank's scores; column ``l`` is its local position ``l`` (global
            ``l * D + rank``), ``-inf`` where a key is not visible to the row.
        shard: this rank's place in the group (``shard.size`` must be the group's size).
        group: the DCP process group (``ParallelContext.dcp_group``; ``dist.group.WORLD`` for all ranks).
        topk: the budget.
        candidates: what each rank sends in round 1 (default ``default_candidates``); ``topk`` or more
            makes round 2 impossible.
        stats: counters to add this call's rounds and bytes to.

    Returns:
        ``[T, topk]`` int32 global positions, best first, -1 padded: equal to
        ``kernels.dsa.paged_naive.topk_by_score`` over the whole sequence's scores.

    Raises:
        ValueError: a group whose size is not ``shard.size``, or a non-positive ``topk``/``candidates``.
    """
    if dist.get_world_size(group) != shard.size:
        raise ValueError(f"group: {dist.get_world_size(group)} ranks, but the DCP shard says {shard.size}")
    sent = min(topk, default_candidates(topk, shard.size) if candidates is None else candidates)
    if topk < 1 or sent < 1:
        raise ValueError(f"topk ({topk}) and candidates ({candidates}) must be at least 1")
    stats = stats if stats is not None else ExchangeStats()
    stats.calls += 1
    local = torch.arange(scores.shape[1], device=scores.device)
    positions = shard.global_positions(local).expand(scores.shape[0], -1)
    held = (scores > float("-inf")).sum(dim=-1)
    gathered = _all_gather(group, *best_candidates(scores, positions, sent), held, stats)
    _, merged = merge_candidates(gathered[0], gathered[1], topk)
    if sent == topk:
        return merged
    rows = needs_refill(gathered[1], gathered[2], merged).nonzero().flatten()
    if rows.numel():  # the same count on every rank: computed from the same gathered bytes
        stats.refills += 1
        stats.refilled_rows += rows.numel()
        # A rank's best k of these rows only (round 1 ranked c: the first c of the same order).
        best_scores, best_positions = best_candidates(scores[rows], positions[rows], topk)
        again = _all_gather(group, best_scores, best_positions, held[rows], stats)
        merged[rows] = merge_candidates(again[0], again[1], topk)[1]
    return merged
