"""The cache a PCP rank's layers see: MLA writes gathered from every rank of the group.

Who writes what: every PCP rank keeps a full copy of the step's MLA rows. A layer's ``write`` is
called on each rank with that rank's rows only; ``PcpMlaLayerCache.write`` all-gathers the latents,
rotary keys and DSA index keys of the group, puts them in the undivided step's row order and writes
every row once, at the undivided step's ``slot_mapping``. So after the layer each rank's pool holds
exactly what a single rank's pool holds, attention reads every earlier key locally, and decode (or
the handoff, from any one PCP rank) continues from it. KDA slots are written by ``PcpKda``.
"""

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist

from services.engine.model.layer_cache import KdaLayerCache, MlaLayerCache, ModelCache

from .pcp_rows import gather_rows
from .zigzag import ZigzagPlan


@dataclass(frozen=True)
class RowExchange:
    """One step's PCP row bookkeeping: the plan, this rank, its group and the undivided slot mapping."""

    plan: ZigzagPlan
    rank: int
    group: dist.ProcessGroup | None
    global_slots: torch.Tensor  # [N] int64, the undivided step's slot_mapping

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """``[n_rank, ...]`` this rank's rows -> ``[N, ...]`` every row of the step, in step order."""
        rows = [list(r) for r in self.plan.global_rows]
        return gather_rows(local, rows, list(range(self.global_slots.shape[0])), self.group)


@dataclass(frozen=True)
class PcpMlaLayerCache(MlaLayerCache):
    """An ``MlaLayerCache`` whose ``write`` stores the whole group's rows (module docstring)."""

    exchange: RowExchange

    def write(self, slot_mapping, latent, k_rope, index_keys) -> None:
        del slot_mapping  # this rank's rows' slots; the gathered rows go to the undivided step's
        gather = self.exchange.gather
        keys = None if index_keys is None else gather(index_keys)
        super().write(self.exchange.global_slots, gather(latent), gather(k_rope), keys)


class PcpModelCache:
    """A ``ModelCache`` over ``base`` for one PCP step: gathered MLA writes, KDA views unchanged."""

    def __init__(self, base: ModelCache, exchange: RowExchange):
        self.base, self.exchange = base, exchange

    def mla(self, layer: int) -> PcpMlaLayerCache:
        view = self.base.mla(layer)
        fields = {f.name: getattr(view, f.name) for f in dataclasses.fields(MlaLayerCache)}
        return PcpMlaLayerCache(**fields, exchange=self.exchange)

    def kda(self, layer: int) -> KdaLayerCache:
        return self.base.kda(layer)
