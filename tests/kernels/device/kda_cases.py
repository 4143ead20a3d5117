"""Inputs for the varlen KDA tests (CPU reference and the fla path on GPU share them)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.kda.naive import kda_recurrent


def strided_pool(num_slots: int, heads: int, dim: int, device, seed: int) -> torch.Tensor:
    """``[num_slots, H, K, V]`` float32 view with a slot stride wider than the state, like a slot pool."""
    g = torch.Generator().manual_seed(seed)
    width = heads * dim * dim
    storage = torch.randn(num_slots, width + 32, generator=g).mul_(0.1).to(device)
    return storage[:, 16 : 16 + width].view(num_slots, heads, dim, dim)


def packed_inputs(lengths, has_state, heads, dim, dtype, device, seed=0, slots=None):
    """q, k (normalised), v, g, beta packed over ``lengths``; slots, has_state, cu_seqlens on ``device``."""
    g_ = torch.Generator().manual_seed(seed)
    n = sum(lengths)

    def randn(*shape):
        return torch.randn(*shape, generator=g_)

    q = F.normalize(randn(n, heads, dim), dim=-1)
    k = F.normalize(randn(n, heads, dim), dim=-1)
    v = randn(n, heads, dim)
    g = -torch.rand(n, heads, dim, generator=g_) * 0.5 - 0.01
    beta = torch.rand(n, heads, generator=g_)
    tensors = [t.to(dtype).to(device) for t in (q, k, v)] + [g.to(device), beta.to(dtype).to(device)]
    if slots is None:
        slots = [3, 0, 6, 1, 5, 2][: len(lengths)]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    meta = (
        torch.tensor(slots, dtype=torch.int32, device=device),
        torch.tensor(has_state, dtype=torch.bool, device=device),
        cu,
    )
    return tensors, meta


def per_sequence_loop(q, k, v, g, beta, scale, pool, slots, has_state, cu_seqlens):
    """The oracle: ``kda_recurrent`` per sequence in float32; returns ``(o, {slot: final state})``."""
    out = torch.zeros(v.shape, dtype=torch.float32)
    finals = {}
    bounds = cu_seqlens.tolist()
    for seq, slot in enumerate(slots.tolist()):
        rows = slice(bounds[seq], bounds[seq + 1])
        initial = pool[slot][None].float().cpu() if bool(has_state[seq]) else None
        args = [t[None, rows].float().cpu() for t in (q, k, v, g, beta)]
        o, final = kda_recurrent(*args, scale, initial)
        out[rows] = o[0]
        finals[slot] = final[0]
    return out, finals
