"""Batch-invariant DSA indexer scores in Triton.

``score[t, s] = sum_h w[t, h] * relu(scale * q[t, h] . k[s])``, one program per (query, tile of
``BLOCK_S`` keys)::

    q[t]   [Hi, D]  ─┐
                     ├─ dot (IEEE float32, fixed D)  ->  [Hi, BLOCK_S]  -> relu(. * scale) * w[t, :, None]
    k[s0:s0+BS] [BS, D]                                                   -> sum over Hi (one fixed tree)

Every shape in the kernel is fixed by the model (heads, head dim) and the constant ``BLOCK_S``, and
each output reads only its query, its weights and its key: a score's bits never depend on the number
of queries or keys, or on where they sit. Float32 reference (same signature):
``indexer_scores_reference``.
"""

import torch
import triton
import triton.language as tl

from kernels.triton_env import require_triton_device

BLOCK_S = 32  # keys per program: a constant


@triton.jit(do_not_specialize=["S"])  # the key count changes every step: one compile
def _indexer_kernel(
    q,
    keys,
    weights,
    out,
    S,
    scale,
    stride_qt,
    stride_qh,
    stride_k,
    stride_wt,
    stride_ot,
    HI: tl.constexpr,
    D: tl.constexpr,
    HP: tl.constexpr,
    DP: tl.constexpr,
    BS: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    o_s = tl.program_id(1) * BS + tl.arange(0, BS)
    m_s = o_s < S
    o_h = tl.arange(0, HP)
    o_d = tl.arange(0, DP)
    m_h = o_h < HI
    m_d = o_d < D
    p_q = q + t * stride_qt + o_h[:, None] * stride_qh + o_d[None, :]
    q_t = tl.load(p_q, mask=m_h[:, None] & m_d[None, :], other=0.0)
    p_k = keys + o_s[:, None].to(tl.int64) * stride_k + o_d[None, :]
    k_s = tl.load(p_k, mask=m_s[:, None] & m_d[None, :], other=0.0)
    dots = tl.dot(q_t.to(tl.float32), tl.trans(k_s.to(tl.float32)), input_precision="ieee")  # [HP, BS]
    w_t = tl.load(weights + t * stride_wt + o_h, mask=m_h, other=0.0).to(tl.float32)
    score = tl.sum(w_t[:, None] * tl.maximum(dots * scale, 0.0), axis=0)
    tl.store(out + t * stride_ot + o_s, score, mask=m_s)


def indexer_scores_triton(
    q: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor, scale: float
) -> torch.Tensor:
    """DSA lightning-indexer scores of every query against every key, batch-invariant.

    Args:
        q: ``[T, Hi, D]`` index queries.
        keys: ``[S, D]`` index keys.
        weights: ``[T, Hi]`` per-head weights.
        scale: applied to each dot product before the ReLU.

    Returns:
        ``[T, S]`` float32.
    """
    require_triton_device("indexer_scores_triton", q, keys, weights)
    tokens, heads, dim = q.shape
    s = keys.shape[0]
    q = q if q.stride(-1) == 1 else q.contiguous()
    keys = keys if keys.stride(-1) == 1 else keys.contiguous()
    weights = weights if weights.stride(-1) == 1 else weights.contiguous()
    out = torch.empty(tokens, s, dtype=torch.float32, device=q.device)
    if tokens == 0 or s == 0:
        return out
    grid = (tokens, triton.cdiv(s, BLOCK_S))
    _indexer_kernel[grid](
        q, keys, weights, out, s, float(scale), q.stride(0), q.stride(1), keys.stride(0), weights.stride(0),
        out.stride(0), HI=heads, D=dim, HP=max(16, triton.next_power_of_2(heads)),
        DP=max(16, triton.next_power_of_2(dim)), BS=BLOCK_S, num_warps=4,
    )  # fmt: skip
    return out


def indexer_scores_reference(
    q: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor, scale: float
) -> torch.Tensor:
    """Float32 reference of ``indexer_scores_triton`` (same arguments and result)."""
    dots = torch.einsum("thd,sd->ths", q.float(), keys.float())
    return (weights.float()[:, :, None] * torch.relu(dots * scale)).sum(1)
