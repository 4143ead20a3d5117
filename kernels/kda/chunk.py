"""KDA in chunked (WY) form: the same recurrence as ``naive.kda_recurrent``, a chunk at a time.

Within a chunk of C tokens starting from state ``S0``, let ``G_t = g_1 + ... + g_t`` (cumulative
log decay, per key channel). Unrolling the recurrence gives, for the corrections ``delta``::

    (I + A) delta = beta * v - beta * (k * exp(G)) S0
    A[t, s] = beta_t * sum_c k_t[c] k_s[c] exp(G_t[c] - G_s[c])        (s < t, else 0)

a unit lower-triangular system solved once per chunk. Then::

    o_t  = scale * ( (q_t * exp(G_t)) S0 + sum_{s <= t} (sum_c q_t[c] k_s[c] exp(G_t[c] - G_s[c])) delta_s )
    S_C  = diag(exp(G_C)) S0 + sum_s (k_s * exp(G_C - G_s)) delta_s^T

Only differences ``G_t - G_s`` with ``s <= t`` are exponentiated, so every factor is in ``(0, 1]``.
A sequence whose length is not a multiple of C is padded with ``g = 0, beta = 0, k = 0`` tokens,
which leave the state unchanged.
"""

import torch
import torch.nn.functional as F


def kda_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked KDA; same arguments and results as ``kernels.kda.naive.kda_recurrent``.

    Args:
        q, k: ``[B, T, H, K]`` L2-normalised.
        v: ``[B, T, H, V]``.
        g: ``[B, T, H, K]`` log forget gate.
        beta: ``[B, T, H]``.
        scale: query scale.
        initial_state: ``[B, H, K, V]`` float32 or None.
        chunk_size: tokens per chunk C.

    Returns:
        ``(o [B, T, H, V] in v.dtype, final_state [B, H, K, V] float32)``.
    """
    batch, seq_len, heads, k_dim = k.shape
    v_dim = v.shape[-1]
    pad = (-seq_len) % chunk_size
    num_chunks = (seq_len + pad) // chunk_size

    def to_chunks(x: torch.Tensor) -> torch.Tensor:
        # [B, T, H, D] -> [B, H, N, C, D]
        x = F.pad(x.to(torch.float32), (0, 0, 0, 0, 0, pad))
        return x.reshape(batch, num_chunks, chunk_size, heads, -1).permute(0, 3, 1, 2, 4)

    qc, kc, vc, gc = to_chunks(q), to_chunks(k), to_chunks(v), to_chunks(g)
    bc = to_chunks(beta.unsqueeze(-1)).squeeze(-1)  # [B, H, N, C]
    cum = gc.cumsum(dim=-2)  # G_t
    # decay[t, s, c] = exp(G_t[c] - G_s[c]) for s <= t, 0 above the diagonal
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=k.device).tril()
    diff = cum.unsqueeze(-2) - cum.unsqueeze(-3)  # [B, H, N, C(t), C(s), K]
    decay = diff.masked_fill(~causal[..., None], float("-inf")).exp()
    kk = torch.einsum("bhntc,bhnsc,bhntsc->bhnts", kc, kc, decay)
    qk = torch.einsum("bhntc,bhnsc,bhntsc->bhnts", qc, kc, decay)
    strict = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=k.device).tril(-1)
    system = torch.eye(chunk_size, device=k.device) + (bc.unsqueeze(-1) * kk).masked_fill(~strict, 0.0)
    rhs_v = bc.unsqueeze(-1) * vc  # beta * v
    rhs_s = bc.unsqueeze(-1) * kc * cum.exp()  # beta * k * exp(G), multiplies S0
    u = torch.linalg.solve_triangular(system, rhs_v, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, rhs_s, upper=False, unitriangular=True)
    qk = qk.masked_fill(~causal, 0.0)
    q_decayed = qc * cum.exp()
    k_to_end = kc * (cum[..., -1:, :] - cum).exp()  # k_s * exp(G_C - G_s)

    state = (
        torch.zeros(batch, heads, k_dim, v_dim, dtype=torch.float32, device=v.device)
        if initial_state is None
        else initial_state.to(torch.float32)
    )
    out = torch.empty(batch, heads, num_chunks, chunk_size, v_dim, dtype=torch.float32, device=v.device)
    for n in range(num_chunks):
        delta = u[:, :, n] - w[:, :, n] @ state  # [B, H, C, V]
        out[:, :, n] = scale * (q_decayed[:, :, n] @ state + qk[:, :, n] @ delta)
        state = cum[:, :, n, -1].exp()[..., None] * state + k_to_end[:, :, n].transpose(-1, -2) @ delta
    out = out.reshape(batch, heads, num_chunks * chunk_size, v_dim)[:, :, :seq_len]
    return out.permute(0, 2, 1, 3).to(v.dtype), state
