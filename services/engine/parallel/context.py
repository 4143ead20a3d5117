"""One process's place in a ``ParallelLayout``: its rank and a torch.distributed group per dimension.

Model code takes a ``ParallelContext`` from the start (DESIGN.md section 6): with every degree 1
(``ParallelContext.single()``) each group is None and every shard is the whole tensor, so the
single-process path and the parallel path are the same code.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch.distributed as dist

from .layout import DIMENSIONS, ParallelLayout, RankCoordinates


@dataclass(frozen=True)
class ParallelContext:
    """A rank's layout, coordinates and process groups.

    Attributes:
        layout: the degrees.
        rank: this process's rank in the default group (= its rank in the layout).
        tp_group, dcp_group, pcp_group, pp_group, ep_group: the torch.distributed group of this rank
            along each dimension, None where that degree is 1.
    """

    layout: ParallelLayout
    rank: int = 0
    tp_group: dist.ProcessGroup | None = None
    dcp_group: dist.ProcessGroup | None = None
    pcp_group: dist.ProcessGroup | None = None
    pp_group: dist.ProcessGroup | None = None
    ep_group: dist.ProcessGroup | None = None

    @staticmethod
    def single() -> "ParallelContext":
        """One process: every degree 1, no groups."""
        return ParallelContext(ParallelLayout())

    @property
    def coordinates(self) -> RankCoordinates:
        return self.layout.coordinates(self.rank)

    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def tp_rank(self) -> int:
        return self.coordinates.tp

    @property
    def ep(self) -> int:
        return self.layout.ep

    @property
    def ep_rank(self) -> int:
        return self.coordinates.ep


def build_parallel_context(
    layout: ParallelLayout, ranks: Sequence[int] | None = None
) -> ParallelContext | None:
    """Create every dimension's groups from the initialised default group and return this rank's context.

    Collective over the default group: every process must call it, with the same arguments, in the
    same order relative to other group creations (``dist.new_group`` is collective).

    Args:
        layout: the degrees.
        ranks: the default-group ranks that run the layout, layout rank ``i`` on ``ranks[i]``
            (default: the whole default group, in order). Lets one set of processes run several
            layouts one after another (tests).

    Returns:
        This process's context, or None when it is not among ``ranks``.

    Raises:
        RuntimeError: torch.distributed is not initialised, or the process count is not the layout's.
    """
    if not dist.is_initialized():
        raise RuntimeError(
            "build_parallel_context: torch.distributed is not initialised (init_process_group)"
        )
    ranks = list(range(dist.get_world_size())) if ranks is None else list(ranks)
    if len(ranks) != layout.world_size:
        raise RuntimeError(
            f"build_parallel_context: {len(ranks)} processes for a layout of "
            f"{layout.world_size} ranks ({layout}); start one process per rank"
        )
    me = dist.get_rank()
    groups = {}
    for dimension in DIMENSIONS:
        mine = None
        for members in layout.groups(dimension):
            group = dist.new_group([ranks[m] for m in members]) if len(members) > 1 else None
            if me in ranks and ranks.index(me) in members:
                mine = group
        groups[f"{dimension}_group"] = mine
    return ParallelContext(layout, ranks.index(me), **groups) if me in ranks else None
