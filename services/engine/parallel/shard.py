"""Which part of a full checkpoint tensor a rank's parameter holds.

A module built for a ``ParallelContext`` allocates only its rank's part of each sharded parameter and
lists it in ``parameter_shards`` (parameter name under the module -> ``Shard``); the loader reads
``model_shards(model)`` to cut each checkpoint tensor. A dim made of ``blocks`` equal blocks (KDA's
fused q/k/v short conv) is cut block by block::

    conv1d rows (blocks=3, count=2):  [ q0 q1 | k0 k1 | v0 v1 ]
    rank 0 holds                         q0      k0      v0
"""

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Shard:
    """Part ``index`` of ``count`` equal parts of dim ``dim`` (of each of its ``blocks`` blocks)."""

    dim: int
    index: int
    count: int
    blocks: int = 1

    def full_indices(self, full_size: int) -> torch.Tensor:
        """The indices along ``dim`` of the full tensor (size ``full_size``) this part holds, ascending.

        Raises:
            ValueError: ``full_size`` not divisible into ``blocks * count`` parts.
        """
        if full_size % (self.blocks * self.count):
            raise ValueError(f"a dim of {full_size} does not split into {self.blocks} x {self.count} parts")
        block = full_size // self.blocks
        part = block // self.count
        starts = [b * block + self.index * part for b in range(self.blocks)]
        return torch.cat([torch.arange(s, s + part) for s in starts])

    def take(self, full: torch.Tensor) -> torch.Tensor:
        """This part of ``full``."""
        return full.index_select(self.dim, self.full_indices(full.shape[self.dim]).to(full.device))


def model_shards(model: nn.Module) -> dict[str, Shard]:
    """Every sharded parameter of ``model`` by its full name (modules' ``parameter_shards``)."""
    shards = {}
    for prefix, module in model.named_modules():
        for name, shard in getattr(module, "parameter_shards", {}).items():
            shards[f"{prefix}.{name}" if prefix else name] = shard
    return shards
