"""Rows spread over PCP ranks, put back together in one order on every rank.

Ranks hold different numbers of rows, so each pads its rows to the group's largest count, the padded
blocks are all-gathered, and the real rows are placed where ``order`` wants them: a copy, so every
row keeps its bits and every rank ends with the same tensor.
"""

import torch
import torch.distributed as dist


def gather_rows(
    local: torch.Tensor,
    rows_per_rank: list[list[int]],
    order: list[int],
    group: dist.ProcessGroup | None,
) -> torch.Tensor:
    """Every rank's rows, arranged by global row id.

    Args:
        local: ``[n_r, ...]`` this rank's rows (``n_r = len(rows_per_rank[rank])``).
        rows_per_rank: ``rows_per_rank[r]`` the global row id of each of rank ``r``'s rows, for every
            rank of ``group`` in group order (one list when ``group`` is None).
        order: the global row ids wanted, in output order (each held by exactly one rank).
        group: the PCP group, or None for one rank.

    Returns:
        ``[len(order), ...]`` on every rank.
    """
    where = {row: (rank, i) for rank, rows in enumerate(rows_per_rank) for i, row in enumerate(rows)}
    if group is None:
        index = torch.tensor([where[row][1] for row in order], dtype=torch.long, device=local.device)
        return local[index]
    widest = max(len(rows) for rows in rows_per_rank)
    padded = local.new_zeros(widest, *local.shape[1:])
    padded[: local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in rows_per_rank]
    dist.all_gather(parts, padded, group=group)
    flat = torch.cat(parts)
    index = [rank * widest + i for rank, i in (where[row] for row in order)]
    return flat[torch.tensor(index, dtype=torch.long, device=local.device)]
