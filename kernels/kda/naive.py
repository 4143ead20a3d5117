"""Kimi Delta Attention (KDA), token-by-token recurrent reference.

Per head, with recurrent state ``S [K, V]`` (float32) and per-channel log-decay ``g_t <= 0``::

    S      <- diag(exp(g_t)) S                    # decay first,
    delta  =  beta_t * (v_t - S^T k_t)            # then read what the memory predicts for k_t,
    S      <- S + k_t delta^T                     # write the correction,
    o_t    =  scale * S^T q_t

``q`` and ``k`` are expected L2-normalised (see ``l2_normalize``).
"""

import torch

from kernels.kda.chunk import kda_chunked
from kernels.kda.token_slots import own_lengths

VARLEN_CHUNK_SIZE = 64


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim, in float32 (the fla convention, not ``max``)."""
    xf = x.to(torch.float32)
    return xf / torch.sqrt((xf * xf).sum(dim=-1, keepdim=True) + eps)


def kda_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the KDA recurrence one token at a time.

    Args:
        q, k: ``[B, T, H, K]`` L2-normalised queries and keys.
        v: ``[B, T, H, V]`` values.
        g: ``[B, T, H, K]`` log forget gate (``<= 0``).
        beta: ``[B, T, H]`` write strength in ``(0, 1)``.
        scale: query scale, usually ``K ** -0.5``.
        initial_state: ``[B, H, K, V]`` float32, or None for zeros.

    Returns:
        ``(o [B, T, H, V] in v.dtype, final_state [B, H, K, V] float32)``.
    """
    batch, seq_len, heads, k_dim = k.shape
    v_dim = v.shape[-1]
    qf, kf, vf, gf, bf = (t.to(torch.float32) for t in (q, k, v, g, beta))
    state = (
        torch.zeros(batch, heads, k_dim, v_dim, dtype=torch.float32, device=v.device)
        if initial_state is None
        else initial_state.to(torch.float32).clone()
    )
    out = torch.empty(batch, seq_len, heads, v_dim, dtype=torch.float32, device=v.device)
    for t in range(seq_len):
        state = state * gf[:, t].exp()[..., None]
        predicted = (state * kf[:, t][..., None]).sum(dim=-2)
        delta = (vf[:, t] - predicted) * bf[:, t][..., None]
        state = state + kf[:, t][..., None] * delta[..., None, :]
        out[:, t] = (state * (qf[:, t] * scale)[..., None]).sum(dim=-2)
    return out.to(v.dtype), state


def kda_forget_gate(gate_logits: torch.Tensor, dt_bias: torch.Tensor, a_log: torch.Tensor) -> torch.Tensor:
    """KDA's per-channel log forget gate ``g = -exp(A_log) * softplus(gate_logits + dt_bias)``.

    Args:
        gate_logits: ``[B, T, H, K]`` output of the gate's low-rank projection ``f_b(f_a(x))``.
        dt_bias: ``[H * K]``.
        a_log: ``[H]`` (any shape with H elements) log decay rate per head.

    Returns:
        ``[B, T, H, K]`` float32, ``<= 0``. Softplus switches to the identity above 20, as fla does.
    """
    heads, k_dim = gate_logits.shape[-2:]
    x = gate_logits.to(torch.float32) + dt_bias.to(torch.float32).view(heads, k_dim)
    softplus = torch.where(x > 20.0, x, torch.log(1.0 + torch.exp(x)))
    return -torch.exp(a_log.to(torch.float32).reshape(heads, 1)) * softplus


def kda_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    state_pool: torch.Tensor,
    slots: torch.Tensor,
    has_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_query_len: int,
    any_fresh: bool = True,
    token_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """KDA over a packed batch, each sequence's recurrent state read from and written to its slot.

    Sequence s owns rows ``cu_seqlens[s] : cu_seqlens[s + 1]``; it starts from
    ``state_pool[slots[s]]`` when ``has_state[s]``, else from zeros, and its final state is written
    back to that slot in place. A single token with a state runs ``kda_recurrent``, anything else
    ``kda_chunked`` (as ``Numerics.kda``).

    Args:
        q, k: ``[N, H, K]`` L2-normalised queries and keys.
        v: ``[N, H, V]``.
        g: ``[N, H, K]`` float32 log forget gate (``<= 0``).
        beta: ``[N, H]`` write strength.
        scale: query scale.
        state_pool: ``[num_slots, H, K, V]`` float32 (any slot stride, e.g.
            ``StateSlotPool.view(layer, RECURRENT)``), updated in place.
        slots: ``[S]`` int32 distinct slots.
        has_state: ``[S]`` bool.
        cu_seqlens: ``[S + 1]`` int32.
        max_query_len: the longest sequence (host int; unused by the reference).
        any_fresh: whether some ``has_state`` entry is False (host bool, e.g. from the step's host
            copies); False lets the fast kernel skip zeroing fresh slots. The reference checks it.
        token_slots: ``[S, T]`` int32 per-token slots (``kernels/kda/token_slots.py``), or None: the own
            slot ends with the state after the last own column (the own tokens run as above), each other
            column's token runs ``kda_recurrent`` and its state goes to that column's slot.

    Returns:
        ``o [N, H, V]`` in ``v.dtype``. A sequence with no rows leaves its slot as it was (zeroed when
        it had no state).
    """
    del max_query_len
    if not any_fresh and not bool(has_state.all()):
        raise ValueError("any_fresh: False, but has_state marks a sequence without state")
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    bounds = cu_seqlens.tolist()
    counts = cu_seqlens.diff().tolist()
    owned = counts if token_slots is None else own_lengths(token_slots, slots, cu_seqlens)
    for seq, slot in enumerate(slots.tolist()):
        start, end = bounds[seq], bounds[seq] + owned[seq]
        initial = state_pool[slot][None] if bool(has_state[seq]) else None
        if end == start:
            if initial is None:
                state_pool[slot] = 0
            continue
        rows = slice(start, end)
        args = (q[None, rows], k[None, rows], v[None, rows], g[None, rows], beta[None, rows], scale, initial)
        if end - start == 1 and initial is not None:
            o, final = kda_recurrent(*args)
        else:
            o, final = kda_chunked(*args, VARLEN_CHUNK_SIZE)
        out[rows] = o[0]
        state_pool[slot] = final[0]
        for t in range(owned[seq], counts[seq]):  # the drafts: one token at a time, every state kept
            row = slice(start + t, start + t + 1)
            o, final = kda_recurrent(
                q[None, row], k[None, row], v[None, row], g[None, row], beta[None, row], scale, final
            )
            out[row] = o[0]
            state_pool[int(token_slots[seq, t])] = final[0]
    return out
