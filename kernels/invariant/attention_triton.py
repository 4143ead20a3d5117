"""Batch-invariant absorbed MLA attention in Triton: per query, its keys in fixed tiles in position order.

The invariant numerics run MLA absorbed for prefill and decode alike: each query ``t`` attends over
exactly the keys it may see, listed in position order (``key_index[t, :counts[t]]``; a causal prefix
and a DSA selection look the same). One program per (query, block of heads)::

    keys of query t:   | tile 0 (BLOCK_N) | tile 1 | ... | last tile (masked tail) |   counts[t] keys
    per tile, in order:  s = q_lat . lat^T + q_rope . rope^T      (float32, IEEE dots)
                         online softmax: m, l, acc rescaled, acc += p . lat

The tiles start at the query's first key and stop at its last one, whatever the batch's widest key
list: a query's bits depend only on its own latent query, its keys and ``scale``, never on the other
queries, their number, or the padding of ``key_index`` (so prefill equals decode). ``BLOCK_N`` and
``BLOCK_H`` are constants. Float32 reference (same signature): ``mla_latent_attention_reference``.
"""

import torch
import triton
import triton.language as tl

from kernels.triton_env import require_triton_device

BLOCK_N = 32  # keys per tile: a constant, never derived from the key count
BLOCK_H = 16  # heads per program (the model's head count is fixed)


@triton.jit
def _key_tile(
    q_lat,
    q_rope,
    m_i,
    l_i,
    acc,
    key_index,
    latent,
    k_rope,
    n0,
    count,
    scale,
    stride_lat,
    stride_rope,
    DC: tl.constexpr,
    DR: tl.constexpr,
    DCP: tl.constexpr,
    DRP: tl.constexpr,
    BN: tl.constexpr,
):
    """Fold keys ``[n0, n0 + BN)`` of one query into the online softmax ``(m_i, l_i, acc)``."""
    o_n = n0 + tl.arange(0, BN)
    valid = o_n < count
    idx = tl.load(key_index + o_n, mask=valid, other=0).to(tl.int64)
    o_c = tl.arange(0, DCP)
    o_r = tl.arange(0, DRP)
    m_lat = valid[:, None] & (o_c < DC)[None, :]
    m_rope = valid[:, None] & (o_r < DR)[None, :]
    lat = tl.load(latent + idx[:, None] * stride_lat + o_c[None, :], mask=m_lat, other=0.0).to(tl.float32)
    rope = tl.load(k_rope + idx[:, None] * stride_rope + o_r[None, :], mask=m_rope, other=0.0)
    s = tl.dot(q_lat, tl.trans(lat), input_precision="ieee")
    s = s + tl.dot(q_rope, tl.trans(rope.to(tl.float32)), input_precision="ieee")
    s = tl.where(valid[None, :], s * scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: keep exp finite
    p = tl.where(valid[None, :], tl.exp(s - shift[:, None]), 0.0)
    alpha = tl.where(m_new == m_i, 1.0, tl.exp(m_i - shift))
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p, lat, input_precision="ieee")
    return m_new, l_i, acc


@triton.jit
def _mla_latent_kernel(
    q_latent,
    q_rope,
    latent,
    k_rope,
    key_index,
    counts,
    out,
    scale,
    H,
    stride_qt,
    stride_qh,
    stride_rt,
    stride_rh,
    stride_lat,
    stride_rope,
    stride_kt,
    stride_ot,
    stride_oh,
    DC: tl.constexpr,
    DR: tl.constexpr,
    DCP: tl.constexpr,
    DRP: tl.constexpr,
    BH: tl.constexpr,
    BN: tl.constexpr,
    LOOP_WHILE: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    o_h = tl.program_id(1) * BH + tl.arange(0, BH)
    m_h = o_h < H
    o_c = tl.arange(0, DCP)
    o_r = tl.arange(0, DRP)
    p_q = q_latent + t * stride_qt + o_h[:, None] * stride_qh + o_c[None, :]
    q_lat = tl.load(p_q, mask=m_h[:, None] & (o_c < DC)[None, :], other=0.0).to(tl.float32)
    p_r = q_rope + t * stride_rt + o_h[:, None] * stride_rh + o_r[None, :]
    q_r = tl.load(p_r, mask=m_h[:, None] & (o_r < DR)[None, :], other=0.0).to(tl.float32)
    count = tl.load(counts + t)
    p_keys = key_index + t * stride_kt
    m_i = tl.full([BH], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BH], dtype=tl.float32)
    acc = tl.zeros([BH, DCP], dtype=tl.float32)
    # the interpreter cannot run a for loop over a loaded bound; the same tiles, in the same order
    if LOOP_WHILE:
        n0 = 0
        while n0 < count:
            m_i, l_i, acc = _key_tile(
                q_lat, q_r, m_i, l_i, acc, p_keys, latent, k_rope, n0, count, scale, stride_lat,
                stride_rope, DC, DR, DCP, DRP, BN,
            )  # fmt: skip
            n0 += BN
    else:
        for n0 in tl.range(0, count, BN):
            m_i, l_i, acc = _key_tile(
                q_lat, q_r, m_i, l_i, acc, p_keys, latent, k_rope, n0, count, scale, stride_lat,
                stride_rope, DC, DR, DCP, DRP, BN,
            )  # fmt: skip
    result = tl.where(l_i[:, None] > 0, tl.div_rn(acc, tl.where(l_i > 0, l_i, 1.0)[:, None]), 0.0)
    p_o = out + t * stride_ot + o_h[:, None] * stride_oh + o_c[None, :]
    tl.store(p_o, result, mask=m_h[:, None] & (o_c < DC)[None, :])


def mla_latent_attention_triton(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    k_rope: torch.Tensor,
    scale: float,
    key_index: torch.Tensor,
    counts: torch.Tensor,
) -> torch.Tensor:
    """Absorbed MLA attention in the latent space, each query over its own key list, batch-invariant.

    Args:
        q_latent: ``[T, H, Dc]`` queries absorbed into the latent space (float32 in the invariant path).
        q_rope: ``[T, H, Dr]`` rotary parts of the queries.
        latent: ``[S, Dc]`` cached latents (any float dtype; read as float32).
        k_rope: ``[S, Dr]`` cached rotary keys.
        scale: softmax scale, applied to the summed scores.
        key_index: ``[T, W]`` integer key positions, each row's first ``counts[t]`` in position order;
            entries past ``counts[t]`` are never read.
        counts: ``[T]`` keys per query (0 gives a zero row).

    Returns:
        ``[T, H, Dc]`` float32: ``softmax(scale * (q_latent . lat + q_rope . rope)) . lat`` over each
        query's keys.
    """
    require_triton_device("mla_latent_attention_triton", q_latent, q_rope, latent, k_rope, key_index, counts)
    tokens, heads, dc = q_latent.shape
    dr = q_rope.shape[-1]
    q_latent = q_latent if q_latent.stride(-1) == 1 else q_latent.contiguous()
    q_rope = q_rope if q_rope.stride(-1) == 1 else q_rope.contiguous()
    latent = latent if latent.stride(-1) == 1 else latent.contiguous()
    k_rope = k_rope if k_rope.stride(-1) == 1 else k_rope.contiguous()
    key_index = key_index.to(torch.int32).contiguous()
    counts = counts.to(torch.int32).contiguous()
    out = torch.empty(tokens, heads, dc, dtype=torch.float32, device=q_latent.device)
    if tokens == 0 or heads == 0:
        return out
    grid = (tokens, triton.cdiv(heads, BLOCK_H))
    _mla_latent_kernel[grid](
        q_latent, q_rope, latent, k_rope, key_index, counts, out, float(scale), heads,
        q_latent.stride(0), q_latent.stride(1), q_rope.stride(0), q_rope.stride(1), latent.stride(0),
        k_rope.stride(0), key_index.stride(0), out.stride(0), out.stride(1),
        DC=dc, DR=dr, DCP=max(16, triton.next_power_of_2(dc)), DRP=max(16, triton.next_power_of_2(dr)),
        BH=BLOCK_H, BN=BLOCK_N, LOOP_WHILE=q_latent.device.type == "cpu", num_warps=4,
    )  # fmt: skip
    return out


def mla_latent_attention_reference(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    k_rope: torch.Tensor,
    scale: float,
    key_index: torch.Tensor,
    counts: torch.Tensor,
) -> torch.Tensor:
    """Float32 reference of ``mla_latent_attention_triton`` (same arguments and result), one query at
    a time."""
    tokens, heads, dc = q_latent.shape
    out = torch.zeros(tokens, heads, dc, dtype=torch.float32, device=q_latent.device)
    for t in range(tokens):
        keys = key_index[t, : int(counts[t])].long()
        if keys.numel() == 0:
            continue
        lat, rope = latent[keys].float(), k_rope[keys].float()
        scores = (q_latent[t].float() @ lat.T + q_rope[t].float() @ rope.T) * scale
        out[t] = torch.softmax(scores, -1) @ lat
    return out
