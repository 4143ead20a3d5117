"""The reductions model code runs across a dimension's ranks; each is the identity when the group is None.

Bitwise contract of ``sum_segments``: the result is ``tree_sum`` over the global list of segment
partials, in segment order, whatever the number of ranks holding them (each rank holds a contiguous
run of segments, ranks in increasing order), so it is bitwise independent of the degree.
"""

import torch
import torch.distributed as dist

from kernels.invariant.reduce import tree_sum


def all_reduce_sum(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """The elementwise sum of every rank's ``x`` (default numerics: the backend's reduction order)."""
    if group is None:
        return x
    out = x.contiguous().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


def all_gather_cat(x: torch.Tensor, group: dist.ProcessGroup | None, dim: int = 0) -> torch.Tensor:
    """Every rank's ``x`` (same shape on every rank) concatenated along ``dim`` in rank order."""
    if group is None:
        return x
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim)


def sum_segments(partials: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Sum segment partials in one fixed order across ranks, in float32.

    Args:
        partials: ``[s, ...]`` this rank's ``s`` segment partials (any float dtype, read as float32),
            the same ``s`` on every rank of ``group``.
        group: the ranks holding the other segments (rank order = segment order), or None.

    Returns:
        ``[...]`` float32: ``tree_sum`` of all ``s * group_size`` partials over the segment dim.
    """
    return tree_sum(all_gather_cat(partials.to(torch.float32), group, 0), 0)
