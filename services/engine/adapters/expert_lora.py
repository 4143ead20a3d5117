"""Routed experts with LoRA on each expert's gate, up and down projections.

The same loop as ``kernels.moe.naive.moe_experts`` (experts in increasing id, each token's outputs
accumulated in that order, so a token's bits do not depend on the batch), with every projection's
output passed through the merge contract (``merge.lora_output``) where the adapter adapts it.
"""

import torch

from services.engine.model.numerics import Numerics

from .lora_adapter import LoraPair
from .merge import lora_output


def lora_moe_experts(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    expert_loras: dict[int, dict[str, LoraPair]],
    nx: Numerics,
) -> torch.Tensor:
    """SwiGLU experts with per-expert LoRA pairs.

    Args:
        x: ``[N, D]`` activations of rows that all use this adapter.
        expert_ids: ``[N, k]``; weights: ``[N, k]`` float32 combine weights.
        w_gate_up: ``[E, 2I, D]``; w_down: ``[E, D, I]``.
        expert_loras: expert id -> ``"gate" | "up" | "down"`` -> pair (absent: not adapted).
        nx: the numerics (its ``linear``, ``silu`` and ``linear_f32``).

    Returns:
        ``[N, D]`` in ``x.dtype``.
    """
    out = torch.zeros_like(x)
    for expert in torch.unique(expert_ids).tolist():
        token_idx, slot = torch.where(expert_ids == expert)
        rows = x[token_idx]
        pairs = expert_loras.get(expert, {})
        gate, up = nx.linear(rows, w_gate_up[expert]).chunk(2, dim=-1)
        gate = _adapt(gate, rows, pairs.get("gate"), nx)
        up = _adapt(up, rows, pairs.get("up"), nx)
        hidden = nx.silu(gate) * up
        down = _adapt(nx.linear(hidden, w_down[expert]), hidden, pairs.get("down"), nx)
        y = down * weights[token_idx, slot, None]
        out.index_add_(0, token_idx, y.to(out.dtype))
    return out


def _adapt(base: torch.Tensor, x: torch.Tensor, pair: LoraPair | None, nx: Numerics) -> torch.Tensor:
    return base if pair is None else lora_output(base, x, pair.a, pair.b, pair.scaling, nx)
