"""Multi-head latent attention (MLA) references, in the two forms serving uses.

Each cached token holds one latent ``c [Dc]`` (shared by all heads) and one rotary key part
``k_rope [Dr]``. ``w_kv_b [H * (Dn + Dv), Dc]`` turns the latent into per-head keys and values::

    k_h = [W_uk_h c ; k_rope]     v_h = W_uv_h c       (W_uk_h: [Dn, Dc], W_uv_h: [Dv, Dc])

*Expanded* (prefill) materialises ``k_h`` and ``v_h`` for every token. *Absorbed* (decode) folds
``W_uk`` into the query and ``W_uv`` into the output, so attention runs over the latents directly::

    score = (W_uk_h^T q_nope_h) . c + q_rope_h . k_rope        out_h = W_uv_h (sum_s p_s c_s)

Both give the same result up to float rounding.
"""

import torch


def _split_kv_b(w_kv_b: torch.Tensor, heads: int, nope_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``w_kv_b [H * (Dn + Dv), Dc]`` -> ``(W_uk [H, Dn, Dc], W_uv [H, Dv, Dc])``."""
    per_head = w_kv_b.reshape(heads, -1, w_kv_b.shape[-1])
    return per_head[:, :nope_dim], per_head[:, nope_dim:]


def _softmax_attend(scores: torch.Tensor, allowed: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    scores = scores.masked_fill(~allowed.unsqueeze(1), float("-inf"))
    return torch.softmax(scores.to(torch.float32), dim=-1).to(out_dtype)


def mla_attention_expanded(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    k_rope: torch.Tensor,
    w_kv_b: torch.Tensor,
    scale: float,
    allowed: torch.Tensor,
) -> torch.Tensor:
    """MLA with keys and values expanded per head.

    Args:
        q_nope: ``[B, T, H, Dn]`` query part without position.
        q_rope: ``[B, T, H, Dr]`` rotated query part.
        latent: ``[B, S, Dc]`` normalised KV latents of the attended tokens.
        k_rope: ``[B, S, Dr]`` rotated shared key part.
        w_kv_b: ``[H * (Dn + Dv), Dc]`` latent up-projection.
        scale: softmax scale.
        allowed: ``[B, T, S]`` bool, True where query t may attend to key s (causal, DSA top-k).
            Every row must allow at least one key.

    Returns:
        ``[B, T, H, Dv]``.
    """
    heads, nope_dim = q_nope.shape[2], q_nope.shape[3]
    kv = (latent @ w_kv_b.transpose(0, 1)).reshape(*latent.shape[:2], heads, -1)  # [B, S, H, Dn + Dv]
    k_nope, value = kv[..., :nope_dim], kv[..., nope_dim:]
    scores = torch.einsum("bthd,bshd->bhts", q_nope, k_nope) + torch.einsum("bthd,bsd->bhts", q_rope, k_rope)
    probs = _softmax_attend(scores * scale, allowed, q_nope.dtype)
    return torch.einsum("bhts,bshd->bthd", probs, value)


def mla_attention_absorbed(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    k_rope: torch.Tensor,
    w_kv_b: torch.Tensor,
    scale: float,
    allowed: torch.Tensor,
) -> torch.Tensor:
    """MLA computed in the latent space; same arguments and result as ``mla_attention_expanded``."""
    heads, nope_dim = q_nope.shape[2], q_nope.shape[3]
    w_uk, w_uv = _split_kv_b(w_kv_b, heads, nope_dim)
    q_latent = torch.einsum("bthd,hdc->bthc", q_nope, w_uk)  # [B, T, H, Dc]
    scores = torch.einsum("bthc,bsc->bhts", q_latent, latent) + torch.einsum("bthd,bsd->bhts", q_rope, k_rope)
    probs = _softmax_attend(scores * scale, allowed, q_nope.dtype)
    out_latent = torch.einsum("bhts,bsc->bthc", probs, latent)
    return torch.einsum("bthc,hdc->bthd", out_latent, w_uv)
