"""One step's rows grouped by adapter, and the two calls the layers make to apply them.

```
 rows:          | seq 0 (base) | seq 1 (adapter "a") | seq 2 (adapter "b") | seq 3 ("a") |
 groups:        "a" -> rows of seq 1 and seq 3,  "b" -> rows of seq 2   (base rows: no group)
```
Built once per step from host values (no device read). For each adapted linear, each group's rows are
gathered, passed through the merge contract and written back; base rows keep the base output's bits
(the output is only cloned, never recomputed). Groups run in increasing adapter slot; a row belongs to
one group, so the order cannot change a row.

Routed experts: the step's MoE backend first computes every row as the base model does; then each
group whose adapter adapts this layer's experts recomputes its rows with ``lora_moe_experts`` (the
reference expert loop) and replaces them. That computes adapted rows' experts twice, which is the
simple correct form; a segmented grouped-GEMM kernel is the fast one.
"""

from collections.abc import Mapping

import torch
from torch import nn

from services.engine.model.numerics import Numerics

from .expert_lora import lora_moe_experts
from .lora_adapter import LoraAdapter
from .merge import lora_output


class StepLora:
    """The step's adapter groups: ``(adapter, rows [n] int64 on the device)``, in increasing slot.

    Args:
        groups: the groups (rows of different groups are disjoint).
    """

    def __init__(self, groups: list[tuple[LoraAdapter, torch.Tensor]]):
        self.groups = groups

    @classmethod
    def build(
        cls,
        seq_adapters: tuple[int, ...],
        query_start_loc: tuple[int, ...],
        table: Mapping[int, LoraAdapter],
        device: torch.device,
    ) -> "StepLora | None":
        """Group a step's rows by their sequence's adapter slot (0: none); None when no row has one.

        Args:
            seq_adapters: each sequence's adapter slot (``StepMetadata.seq_adapters_host``).
            query_start_loc: the sequences' row offsets (host).
            table: slot -> adapter, covering every nonzero slot.
            device: where the row indices go.
        """
        rows: dict[int, list[int]] = {}
        for seq, slot in enumerate(seq_adapters):
            if slot:
                rows.setdefault(slot, []).extend(range(query_start_loc[seq], query_start_loc[seq + 1]))
        if not rows:
            return None
        groups = [
            (table[slot], torch.tensor(rows[slot], dtype=torch.int64, device=device)) for slot in sorted(rows)
        ]
        return cls(groups)

    def linear(self, module: nn.Linear, x: torch.Tensor, base: torch.Tensor, nx: Numerics) -> torch.Tensor:
        """``base`` (``module``'s output for ``x [N, K]``) with each group's adapter applied to its rows."""
        out = base
        for adapter, rows in self.groups:
            pair = adapter.linears.get(module)
            if pair is None:
                continue
            if out is base:
                out = base.clone()
            out[rows] = lora_output(base[rows], x[rows], pair.a, pair.b, pair.scaling, nx)
        return out

    def experts(
        self,
        module: nn.Module,
        x: torch.Tensor,
        expert_ids: torch.Tensor,
        weights: torch.Tensor,
        base: torch.Tensor,
        nx: Numerics,
    ) -> torch.Tensor:
        """``base`` (the routed experts' output ``[N, D]``) with adapted groups' rows recomputed."""
        out = base
        for adapter, rows in self.groups:
            loras = adapter.experts.get(module)
            if loras is None:
                continue
            if out is base:
                out = base.clone()
            out[rows] = lora_moe_experts(
                x[rows], expert_ids[rows], weights[rows], module.gate_up_proj, module.down_proj, loras, nx
            )
        return out


def project(x: torch.Tensor, module: nn.Linear, nx: Numerics, lora: StepLora | None) -> torch.Tensor:
    """A layer's linear: ``nx.linear(x, module.weight)``, then the step's adapters on their rows."""
    base = nx.linear(x, module.weight)
    return base if lora is None else lora.linear(module, x, base, nx)
