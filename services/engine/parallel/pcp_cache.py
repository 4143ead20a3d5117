"""The cache a PCP rank's layers see: MLA writes gathered from every rank of the group.

Who writes what: every PCP rank keeps a full copy of the step's MLA rows. A layer's ``write`` is
called on each rank with that rank's rows only; ``PcpMlaLayerCache.write`` all-gathers the latents,
rotary keys and DSA index keys of the group, puts them in the undivided step's row order and writes
every row once, at the undivided step's ``slot_mapping``. So after the layer each rank's pool holds
exactly what a single rank's pool holds, attention reads every earlier key locally, and decode (or
the handoff, from any one PCP rank) continues from it. KDA slots are written by ``PcpKda``.

Under DCP too (``RowExchange.shard``) the step's slots are virtual (``dcp_shard.py``): after the
gather a rank keeps only the rows its DCP rank owns (``p % dcp``), at their local slots, so its pool
is the DCP rank's shard of a single rank's cache; the attention over it is ``DcpAttention``'s, whose
write hands every row to this cache (``GatheredDcpAttention``)::

    pcp 2 x dcp 2, one 8-token piece per PCP rank (positions 0-7 on pcp 0, 8-15 on pcp 1):
        gather over the PCP group (same DCP rank):   rows 0..15 on every rank
        DCP rank 0 writes 0 2 4 ... 14               DCP rank 1 writes 1 3 5 ... 15
"""

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist

from services.engine.model.layer_cache import KdaLayerCache, MlaLayerCache, ModelCache

from .dcp_attention import DcpAttention
from .dcp_shard import DcpShard
from .pcp_rows import gather_rows
from .zigzag import ZigzagPlan


@dataclass(frozen=True)
class RowExchange:
    """One step's PCP row bookkeeping: the plan, this rank, its group, the undivided slot mapping
    (virtual slots under DCP) and, under DCP, this rank's DCP shard."""

    plan: ZigzagPlan
    rank: int
    group: dist.ProcessGroup | None
    global_slots: torch.Tensor  # [N] int64, the undivided step's slot_mapping
    shard: DcpShard | None = None

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
        latent, k_rope = gather(latent), gather(k_rope)
        keys = None if index_keys is None else gather(index_keys)
        shard, slots = self.exchange.shard, self.exchange.global_slots
        if shard is not None:  # keep this DCP rank's rows, at its local slots
            owned, local = shard.local_slots(slots, shard.size * self.block_size)
            rows = owned.nonzero().flatten()
            keys = None if keys is None else keys[rows]
            latent, k_rope, slots = latent[rows], k_rope[rows], local[rows]
        super().write(slots, latent, k_rope, keys)


class GatheredDcpAttention(DcpAttention):
    """``DcpAttention`` over a ``PcpMlaLayerCache``: the write passes every row of this PCP rank to the
    cache, which gathers the PCP group's rows and keeps this DCP rank's share (module docstring)."""

    @staticmethod
    def of(attention: DcpAttention) -> "GatheredDcpAttention":
        return GatheredDcpAttention(
            attention.paged_mla_decode,
            attention.merge_by_lse,
            attention.kind,
            attention.shard,
            attention.group,
        )

    def write(self, cache, meta, latent, k_rope, index_keys):
        """Every row to ``cache.write`` (a ``PcpMlaLayerCache``: it selects this DCP rank's rows)."""
        cache.write(meta.slot_mapping, latent, k_rope, index_keys)


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
