"""Routed experts sharded over an EP group: each rank runs its experts for all of the group's tokens.

Rank ``r`` of ``ep`` holds experts ``[r * E / ep, (r + 1) * E / ep)``. A rank computes, for every
(token, slot) routed to one of its experts, the slot's weighted output, and zeros elsewhere
(``expert_slot_outputs``); the group then combines:

- default numerics: each rank combines its slots, the partial sums are all-reduced;
- batch-invariant numerics: the per-slot outputs are all-gathered, each slot takes its owner's
  value (exact: a selection, not a sum), and ``combine_in_expert_order`` adds a token's slots in
  increasing expert id starting from zero: the order ``kernels.moe.naive.moe_experts`` adds them
  in, so EP 2 gives the bits of EP 1 (the single-rank ``Numerics.moe_experts``).
"""

import torch

from services.engine.model.numerics import Numerics

from .collectives import all_gather_cat, all_reduce_sum
from .context import ParallelContext


def expert_slot_outputs(
    x: torch.Tensor,
    local_ids: torch.Tensor,
    weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    nx: Numerics,
) -> torch.Tensor:
    """Each (token, slot)'s weighted SwiGLU output for the slots routed to a local expert.

    Args:
        x: ``[N, D]``.
        local_ids: ``[N, k]`` expert ids relative to this rank's first expert; ids outside
            ``[0, E_local)`` belong to other ranks.
        weights: ``[N, k]`` float32 combine weights.
        w_gate_up: ``[E_local, 2I, D]``; w_down: ``[E_local, D, I]``.
        nx: the numerics (its ``linear`` and ``silu``, as ``Numerics.moe_experts`` uses them).

    Returns:
        ``[N, k, D]`` in ``x.dtype``, zero at slots of other ranks' experts.
    """
    out = x.new_zeros(*local_ids.shape, x.shape[-1])
    for expert in range(w_gate_up.shape[0]):
        token_idx, slot = torch.where(local_ids == expert)
        if token_idx.numel() == 0:
            continue
        gate, up = nx.linear(x[token_idx], w_gate_up[expert]).chunk(2, dim=-1)
        y = nx.linear(nx.silu(gate) * up, w_down[expert]) * weights[token_idx, slot, None]
        out[token_idx, slot] = y.to(x.dtype)
    return out


def combine_in_expert_order(slots: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
    """``[N, k, D]`` per-slot outputs -> ``[N, D]``: each token's slots added one at a time in
    increasing expert id, starting from zero (``moe_experts``' order)."""
    order = expert_ids.argsort(dim=1)
    ordered = slots.gather(1, order[..., None].expand_as(slots))
    out = torch.zeros_like(slots[:, 0])
    for column in range(slots.shape[1]):
        out = out + ordered[:, column]
    return out


def expert_parallel_experts(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    nx: Numerics,
    parallel: ParallelContext,
) -> torch.Tensor:
    """The routed experts' combined output over the EP group (see the module docstring).

    Args:
        x: ``[N, D]`` (the same on every rank of the group); expert_ids, weights: ``[N, k]``.
        w_gate_up, w_down: this rank's experts, ``[E / ep, ...]``.

    Returns:
        ``[N, D]`` in ``x.dtype`` on every rank of the group.
    """
    local = w_gate_up.shape[0]
    slots = expert_slot_outputs(x, expert_ids - parallel.ep_rank * local, weights, w_gate_up, w_down, nx)
    if not nx.batch_invariant:
        return all_reduce_sum(combine_in_expert_order(slots, expert_ids), parallel.ep_group)
    gathered = all_gather_cat(slots[None], parallel.ep_group, 0)  # [ep, N, k, D]
    owner = (expert_ids // local)[None, ..., None].expand(1, *slots.shape)
    return combine_in_expert_order(gathered.gather(0, owner)[0], expert_ids)
