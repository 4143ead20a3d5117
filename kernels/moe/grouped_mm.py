"""Grouped-GEMM MoE on ``torch._grouped_mm``: the peer of ``kernels.moe.grouped`` (same signature).

Pairs are sorted by expert (no padding: ``_grouped_mm`` takes each group's end row in ``offs``), the
activations gathered in that order, two grouped GEMMs with SiLU·up and the routing weight in torch
between them, then a sorted combine. ``torch._grouped_mm`` is a private op: on CUDA it needs sm90+
and bf16 (its CPU fallback also takes float32), and rows of 16-byte multiples.
"""

import torch
import torch.nn.functional as F


def moe_grouped(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
) -> torch.Tensor:
    """Same arguments and result as ``kernels.moe.naive.moe_grouped``, on ``torch._grouped_mm``.

    Args:
        x: ``[N, D]``; expert_ids: ``[N, k]``; weights: ``[N, k]`` float32;
        w_gate_up: ``[E, 2I, D]``; w_down: ``[E, D, I]``.

    Returns:
        ``[N, D]`` in ``x.dtype``.
    """
    tokens, hidden = x.shape
    top_k = expert_ids.shape[1]
    num_experts = w_gate_up.shape[0]
    flat = expert_ids.reshape(-1).to(torch.int64)
    order = torch.sort(flat, stable=True).indices
    counts = torch.zeros(num_experts, dtype=torch.int64, device=x.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    offs = counts.cumsum(0).to(torch.int32)
    rows = x.index_select(0, order // top_k)
    gate_up = torch._grouped_mm(rows, w_gate_up.transpose(1, 2), offs=offs)
    gate, up = gate_up.chunk(2, dim=-1)
    act = (F.silu(gate) * up).contiguous()
    y = torch._grouped_mm(act, w_down.transpose(1, 2), offs=offs)
    y = (y.float() * weights.reshape(-1).to(torch.float32)[order, None]).to(x.dtype)
    pairs = torch.empty_like(y).index_copy_(0, order, y)
    return pairs.view(tokens, top_k, hidden).sum(dim=1, dtype=torch.float32).to(x.dtype)
