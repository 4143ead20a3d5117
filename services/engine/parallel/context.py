"""One process's place in a ``ParallelLayout``: its rank and a torch.distributed group per dimension.

Model code takes a ``ParallelContext`` from the start (DESIGN.md section 6): with every degree 1
(``ParallelContext.single()``) each group is None and every shard is the whole tensor, so the
single-process path and the parallel path are the same code.
"""

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


def build_parallel_context(layout: ParallelLayout) -> ParallelContext:
    """Create every dimension's groups from the initialised default group and return this rank's context.

    Collective over the default group: every rank must call it, with the same layout, in the same
    order relative to other group creations (``dist.new_group`` is collective).

    Raises:
        RuntimeError: torch.distributed is not initialised, or its world size is not the layout's.
    """
    if not dist.is_initialized():
        raise RuntimeError(
            "build_parallel_context: torch.distributed is not initialised (init_process_group)"
        )
    if dist.get_world_size() != layout.world_size:
        raise RuntimeError(
            f"build_parallel_context: {dist.get_world_size()} processes for a layout of "
            f"{layout.world_size} ranks ({layout}); start one process per rank"
        )
    rank = dist.get_rank()
    groups = {}
    for dimension in DIMENSIONS:
        mine = None
        for ranks in layout.groups(dimension):
            group = dist.new_group(ranks) if len(ranks) > 1 else None
            if rank in ranks:
                mine = group
        groups[f"{dimension}_group"] = mine
    return ParallelContext(layout, rank, **groups)
