"""Mixture-of-experts references: the sigmoid group-limited router and the expert combine.

Routing (DeepSeek-V3 / Kimi "noaux_tc"): scores are ``sigmoid(logits)`` (computed by the caller);
a per-expert correction bias is added only to *choose* experts. Experts are split into
``n_group`` groups, each group is scored by the sum of its two best biased scores, the
``topk_group`` best groups are kept, and the ``top_k`` best biased experts inside them are chosen.
Their *unbiased* scores, optionally renormalised, times ``routed_scaling_factor`` are the combine
weights.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F


def route_tokens(
    scores: torch.Tensor,
    correction_bias: torch.Tensor,
    top_k: int,
    n_group: int,
    topk_group: int,
    norm_topk_prob: bool,
    routed_scaling_factor: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick experts for each token.

    Args:
        scores: ``[N, E]`` float32 router probabilities, ``sigmoid(router logits)``.
        correction_bias: ``[E]`` float32 selection bias.
        top_k, n_group, topk_group: routing budget (see module docstring).
        norm_topk_prob: renormalise the chosen scores to sum to one.
        routed_scaling_factor: multiplies the final weights.

    Returns:
        ``(weights [N, top_k] float32, expert_ids [N, top_k] int64)``.
    """
    tokens, experts = scores.shape
    scores = scores.to(torch.float32)
    biased = scores + correction_bias.to(torch.float32)
    grouped = biased.view(tokens, n_group, experts // n_group)
    best_two = grouped.topk(2, dim=-1).values
    group_scores = best_two[..., 0] + best_two[..., 1]
    kept_groups = group_scores.topk(topk_group, dim=-1).indices
    group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept_groups, True)
    expert_mask = group_mask.unsqueeze(-1).expand_as(grouped).reshape(tokens, experts)
    expert_ids = biased.masked_fill(~expert_mask, float("-inf")).topk(top_k, dim=-1).indices
    weights = scores.gather(1, expert_ids)
    if norm_topk_prob:
        # Column by column, in a fixed order: the total must not depend on the batch.
        total = weights[:, 0]
        for column in range(1, top_k):
            total = total + weights[:, column]
        weights = weights / (total[:, None] + 1e-20)
    return weights * routed_scaling_factor, expert_ids


def moe_experts(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    linear: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.linear,
    silu: Callable[[torch.Tensor], torch.Tensor] = F.silu,
) -> torch.Tensor:
    """SwiGLU experts, combined in expert-id order.

    Args:
        x: ``[N, D]`` token activations.
        expert_ids: ``[N, k]`` chosen experts.
        weights: ``[N, k]`` combine weights (float32).
        w_gate_up: ``[E, 2I, D]`` gate rows then up rows of each expert.
        w_down: ``[E, D, I]``.
        linear, silu: the matrix product and activation to use (the batch-invariant numerics pass
            their own; each must return ``x``'s dtype).

    Returns:
        ``[N, D]`` in ``x.dtype``: ``sum_j weights[:, j] * down(silu(gate x) * up x)``, accumulated
        expert by expert in increasing id so the summation order does not depend on the batch.
    """
    out = torch.zeros_like(x)
    for expert in torch.unique(expert_ids).tolist():
        token_idx, slot = torch.where(expert_ids == expert)
        gate, up = linear(x[token_idx], w_gate_up[expert]).chunk(2, dim=-1)
        y = linear(silu(gate) * up, w_down[expert]) * weights[token_idx, slot, None]
        out.index_add_(0, token_idx, y.to(out.dtype))
    return out


def moe_grouped(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
) -> torch.Tensor:
    """Reference for the grouped-GEMM MoE (``kernels.moe.grouped``): ``moe_experts`` with library ops.

    Args:
        x: ``[N, D]``.
        expert_ids: ``[N, k]`` chosen experts (shared experts appended by ``with_shared_experts``
            are ordinary ids here).
        weights: ``[N, k]`` float32 combine weights.
        w_gate_up: ``[E, 2I, D]`` gate rows then up rows.
        w_down: ``[E, D, I]``.

    Returns:
        ``[N, D]`` in ``x.dtype``.
    """
    return moe_experts(x, expert_ids, weights, w_gate_up, w_down)


def stack_shared_experts(
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    shared_gate: torch.Tensor,
    shared_up: torch.Tensor,
    shared_down: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Append the shared SwiGLU MLP to the routed experts as ``m = I_s / I`` more experts (once, at load).

    SwiGLU splits exactly over its intermediate columns, ``down(silu(g x) * u x) = sum_j
    down_j(silu(g_j x) * u_j x)``, so a shared MLP of width ``I_s = m * I`` is m experts of width I
    that every token visits with weight 1 (``with_shared_experts``); the grouped GEMM then computes
    the shared part in the same launches as the routed experts.

    Args:
        w_gate_up: ``[E, 2I, D]``; w_down: ``[E, D, I]``.
        shared_gate, shared_up: ``[I_s, D]``; shared_down: ``[D, I_s]`` (``DenseMLP``'s weights).

    Returns:
        ``(w_gate_up [E + m, 2I, D], w_down [E + m, D, I])``.
    """
    inter = w_down.shape[-1]
    shared_inter, hidden = shared_gate.shape
    if shared_inter % inter:
        raise ValueError(f"shared experts: width {shared_inter} is not a multiple of the expert's {inter}")
    m = shared_inter // inter
    gate_up = torch.cat([shared_gate.view(m, inter, hidden), shared_up.view(m, inter, hidden)], dim=1)
    down = shared_down.view(hidden, m, inter).transpose(0, 1)
    return torch.cat([w_gate_up, gate_up.to(w_gate_up.dtype)]), torch.cat([w_down, down.to(w_down.dtype)])


def with_shared_experts(
    expert_ids: torch.Tensor, weights: torch.Tensor, num_routed: int, num_shared: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Route every token also to the shared experts ``num_routed .. num_routed + num_shared - 1``, weight 1.

    Returns:
        ``(expert_ids [N, k + m], weights [N, k + m] float32)``.
    """
    tokens = expert_ids.shape[0]
    shared = torch.arange(num_routed, num_routed + num_shared, device=expert_ids.device)
    shared = shared.to(expert_ids.dtype)
    ids = torch.cat([expert_ids, shared.expand(tokens, num_shared)], dim=1)
    ones = torch.ones(tokens, num_shared, dtype=torch.float32, device=weights.device)
    return ids, torch.cat([weights.to(torch.float32), ones], dim=1)
