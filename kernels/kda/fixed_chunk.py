"""KDA under the CF-BI contract: one row-level computation shared by prefill and decode.

The recurrent state is kept at the last *aligned* chunk boundary (absolute positions multiple of
C = 16) as ``S0``; the rows of the open chunk are kept beside it. Every token, whether it arrives in
a prefill chunk or alone in a decode step, runs the same ``row`` computation against ``S0`` and the
open rows before it, and the state only moves at the chunk's end::

    G_t      = G_{t-1} + g_t                                   (G_{-1} = 0 at the chunk start)
    a_ts     = sum_c k_t[c] k_s[c] exp(G_t[c] - G_s[c])        (s < t, open rows)
    delta_t  = beta_t * ((v_t - sum_c k_t[c] exp(G_t[c]) S0[c]) - sum_s a_ts delta_s)
    o_t      = scale * (sum_c q_t[c] exp(G_t[c]) S0[c] + sum_{s <= t} b_ts delta_s)
    at t = C - 1:   S0 <- exp(G_t) * S0 + sum_s (k_s * exp(G_t - G_s)) delta_s^T ;  open rows cleared

This is the same recurrence as ``naive.kda_recurrent`` (see ``chunk.py`` for the algebra). Every sum
is a ``tree_sum`` and every ``exp`` a ``fixed_exp``, so a row's bits depend only on its own inputs,
``S0`` and the open rows: never on how tokens were grouped into calls or batched with others.
"""

from dataclasses import dataclass

import torch

from kernels.invariant import fixed_exp, tree_sum

CHUNK = 16


@dataclass
class FixedChunkState:
    """``s0 [H, K, V]`` at the last aligned boundary; ``open_k [C, H, K]``, ``open_g [C, H, K]``
    (cumulative log decay since the boundary) and ``open_delta [C, H, V]`` for the first ``count``
    rows of the open chunk. All float32."""

    s0: torch.Tensor
    open_k: torch.Tensor
    open_g: torch.Tensor
    open_delta: torch.Tensor
    count: int

    @staticmethod
    def zeros(heads: int, k_dim: int, v_dim: int, device: torch.device | str = "cpu") -> "FixedChunkState":
        def z(*shape):
            return torch.zeros(*shape, dtype=torch.float32, device=device)

        return FixedChunkState(
            z(heads, k_dim, v_dim), z(CHUNK, heads, k_dim), z(CHUNK, heads, k_dim), z(CHUNK, heads, v_dim), 0
        )

    def clone(self) -> "FixedChunkState":
        return FixedChunkState(
            self.s0.clone(), self.open_k.clone(), self.open_g.clone(), self.open_delta.clone(), self.count
        )

    def recurrent(self) -> torch.Tensor:
        """The plain recurrent state after the last row (for comparison with ``kda_recurrent``)."""
        if self.count == 0:
            return self.s0.clone()
        last = self.open_g[self.count - 1]
        decay = fixed_exp(last[None] - self.open_g[: self.count])  # [n, H, K]
        contrib = (self.open_k[: self.count] * decay)[..., None] * self.open_delta[: self.count, :, None, :]
        return fixed_exp(last)[..., None] * self.s0 + tree_sum(contrib, 0)


def kda_fixed_chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    state: FixedChunkState,
) -> tuple[torch.Tensor, FixedChunkState]:
    """Advance one sequence by T tokens, row by row.

    Args:
        q, k: ``[T, H, K]`` L2-normalised.
        v: ``[T, H, V]``.
        g: ``[T, H, K]`` log forget gate.
        beta: ``[T, H]``.
        scale: query scale.
        state: the state before these tokens (not modified).

    Returns:
        ``(o [T, H, V] float32, state after the tokens)``.
    """
    state = state.clone()
    qf, kf, vf, gf, bf = (t.to(torch.float32) for t in (q, k, v, g, beta))
    rows = [_row(qf[t], kf[t], vf[t], gf[t], bf[t], scale, state) for t in range(q.shape[0])]
    if not rows:
        return torch.empty(0, q.shape[1], v.shape[-1], dtype=torch.float32, device=q.device), state
    return torch.stack(rows), state


def _put(rows: torch.Tensor, index: int, row: torch.Tensor) -> torch.Tensor:
    """``rows`` with ``rows[index]`` replaced by ``row``, out of place: a tensor an earlier row read
    (and autograd saved) is never written, so the trainer's backward runs through this code."""
    return torch.cat([rows[:index], row[None].to(rows.dtype), rows[index + 1 :]])


def _row(q, k, v, g, beta, scale, state: FixedChunkState) -> torch.Tensor:
    n = state.count
    g_cum = g if n == 0 else state.open_g[n - 1] + g  # [H, K]
    decay_now = fixed_exp(g_cum)  # exp(G_t)
    s0_read = tree_sum((k * decay_now)[..., None] * state.s0, 1)  # [H, V]
    s0_out = tree_sum((q * decay_now)[..., None] * state.s0, 1)
    pair_decay = fixed_exp(g_cum[None] - state.open_g[:n])  # [n, H, K]
    a = tree_sum(k[None] * state.open_k[:n] * pair_decay, -1)  # [n, H]
    correction = tree_sum(a[..., None] * state.open_delta[:n], 0)  # [H, V]
    delta = beta[:, None] * ((v - s0_read) - correction)
    b = tree_sum(q[None] * state.open_k[:n] * pair_decay, -1)  # [n, H]
    own = tree_sum(q * k, -1)  # b_tt: exp(G_t - G_t) = 1
    intra = tree_sum(b[..., None] * state.open_delta[:n], 0) + own[:, None] * delta
    out = scale * (s0_out + intra)
    state.open_k = _put(state.open_k, n, k)
    state.open_g = _put(state.open_g, n, g_cum)
    state.open_delta = _put(state.open_delta, n, delta)
    state.count = n + 1
    if state.count == CHUNK:
        to_end = fixed_exp(g_cum[None] - state.open_g)  # [C, H, K]
        update = tree_sum((state.open_k * to_end)[..., None] * state.open_delta[:, :, None, :], 0)
        state.s0 = decay_now[..., None] * state.s0 + update
        state.open_k = torch.zeros_like(state.open_k)
        state.open_g = torch.zeros_like(state.open_g)
        state.open_delta = torch.zeros_like(state.open_delta)
        state.count = 0
    return out
