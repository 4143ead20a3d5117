"""One step's rows grouped by adapter, and the two calls the layers make to apply them.

```
 rows:          | seq 0 (base) | seq 1 (adapter "a") | seq 2 (adapter "b") | seq 3 ("a") |
 groups:        "a" -> rows of seq 1 and seq 3,  "b" -> rows of seq 2   (base rows: no group)
```
Built once per step from host values (no device read). For each adapted linear, each group's rows are
gathered, passed through the merge contract and written back; base rows keep the base output's bits
(the output is only cloned, never recomputed). Groups run in increasing adapter slot; a row belongs to
one group, so the order cannot change a row.

Segmented form (``segmented=True``: default numerics on a GPU): one Triton launch per adapted linear
computes every adapted row's delta with its own adapter's pair (``kernels/lora/segmented.py``, ranks
zero-padded to the step's largest); the scaling, the float32 sum with the base output and the
rounding are the same elementwise steps as ``merge.lora_output``. The batch-invariant numerics always
take the grouped form (their fixed-order products).

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
        segmented: linears take the one-launch segmented kernel instead of one pass per group.
    """

    def __init__(self, groups: list[tuple[LoraAdapter, torch.Tensor]], segmented: bool = False):
        self.groups = groups
        self.segmented = segmented

    @classmethod
    def build(
        cls,
        seq_adapters: tuple[int, ...],
        query_start_loc: tuple[int, ...],
        table: Mapping[int, LoraAdapter],
        device: torch.device,
        segmented: bool = False,
    ) -> "StepLora | None":
        """Group a step's rows by their sequence's adapter slot (0: none); None when no row has one.

        Args:
            seq_adapters: each sequence's adapter slot (``StepMetadata.seq_adapters_host``).
            query_start_loc: the sequences' row offsets (host).
            table: slot -> adapter, covering every nonzero slot.
            device: where the row indices go.
            segmented: use the segmented kernel for linears (see the module docstring).
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
        return cls(groups, segmented)

    def linear(self, module: nn.Linear, x: torch.Tensor, base: torch.Tensor, nx: Numerics) -> torch.Tensor:
        """``base`` (``module``'s output for ``x [N, K]``) with each group's adapter applied to its rows."""
        if self.segmented:
            return self._linear_segmented(module, x, base)
        out = base
        for adapter, rows in self.groups:
            pair = adapter.linears.get(module)
            if pair is None:
                continue
            if out is base:
                out = base.clone()
            out[rows] = lora_output(base[rows], x[rows], pair.a, pair.b, pair.scaling, nx)
        return out

    def _linear_segmented(self, module: nn.Linear, x: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        from kernels.lora.segmented import lora_delta_segmented  # Triton: imported only when used

        present = [(rows, a.linears[module]) for a, rows in self.groups if module in a.linears]
        if not present:
            return base
        rank = max(pair.a.shape[0] for _, pair in present)
        a_stack = x.new_zeros(len(present), rank, x.shape[-1], dtype=torch.float32)
        b_stack = x.new_zeros(len(present), base.shape[-1], rank, dtype=torch.float32)
        slots = torch.full((x.shape[0],), -1, dtype=torch.int32, device=x.device)
        scaling = x.new_zeros(x.shape[0], 1, dtype=torch.float32)
        for index, (rows, pair) in enumerate(present):
            a_stack[index, : pair.a.shape[0]] = pair.a
            b_stack[index, :, : pair.a.shape[0]] = pair.b
            slots[rows] = index
            scaling[rows] = pair.scaling
        delta = lora_delta_segmented(x, slots, a_stack, b_stack)
        rows = torch.cat([rows for rows, _ in present])
        out = base.clone()
        out[rows] = (base[rows].to(torch.float32) + scaling[rows] * delta[rows]).to(base.dtype)
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
