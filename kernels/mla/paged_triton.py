"""Paged absorbed-MLA attention in Triton: all queries of a step in one launch, split-K over keys.

Same math, arguments and results as ``kernels.mla.paged_naive`` (read its docstring first). One
program owns one query token, ``BLOCK_H`` of its heads and one split of its keys; every key row it
loads (latent + rope, or one packed FP8 row dequantised in registers) serves all ``BLOCK_H`` heads,
which is what makes absorbed MLA bandwidth-bound rather than head-bound::

    grid (T, ceil(H / BLOCK_H), splits)          keys of query t: dense 0 .. query_pos[t]
                                                                  sparse topk_positions[t, :]
    split j: keys [j * keys_per_split, (j + 1) * keys_per_split) in tiles of BLOCK_N
      -> online softmax in base 2 -> partial out [T, H, splits, Dc] fp32, lse2 [T, H, splits]
    combine (T, H): out = sum_j 2^(lse2_j - lse2) out_j, lse = ln 2 * log2 sum_j 2^lse2_j

With one split (long batches, prefill) the first kernel writes ``out`` and ``lse`` directly.
Multi-token queries of one sequence (chunked prefill, speculative verification) are just more rows
``t`` with their own ``query_pos`` (causal inside the chunk). The grid depends only on ``T``,
``max_seq_len`` (or ``K``) and ``num_splits``: nothing is read back from the device.
"""

import functools

import torch
import triton
import triton.language as tl

from kernels.fp8.naive import latent_fp8_group_size
from kernels.mla.paged_naive import check_mla_inputs
from kernels.paged import require_triton_device

MIN_KEYS_PER_SPLIT = 256  # a split's partial [H, Dc] fp32 write must stay small beside its key reads


@triton.jit
def _mla_tile(
    q_lat,
    q_rope,
    m_i,
    l_i,
    acc,
    start,
    hi,
    t,
    seq,
    latent_ptr,
    rope_ptr,
    block_tables_ptr,
    topk_ptr,
    stride_lb,
    stride_lr,
    stride_rb,
    stride_rr,
    stride_bt,
    stride_kt,
    sm_scale_log2,
    PAGE: tl.constexpr,
    DC: tl.constexpr,
    DR: tl.constexpr,
    DRP: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPARSE: tl.constexpr,
    FP8: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One tile of ``BLOCK_N`` keys ``[start, start + BLOCK_N) ∩ [.., hi)``: online-softmax update."""
    dtype = q_lat.dtype
    offs_c = tl.arange(0, DC)
    offs_r = tl.arange(0, DRP)
    mask_r = offs_r < DR
    idx = start + tl.arange(0, BLOCK_N)
    if SPARSE:
        pos = tl.load(topk_ptr + t * stride_kt + idx, mask=idx < hi, other=-1)
        valid = pos >= 0
    else:
        pos = idx
        valid = idx < hi
    pos = tl.where(valid, pos, 0)
    block = tl.load(block_tables_ptr + seq * stride_bt + pos // PAGE, mask=valid, other=0).to(tl.int64)
    row = (pos % PAGE).to(tl.int64)
    if FP8:
        row_ptr = latent_ptr + block * stride_lb + row * stride_lr  # uint8 rows
        raw = tl.load(row_ptr[:, None] + offs_c[None, :], mask=valid[:, None], other=0)
        values = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        offs_g = tl.arange(0, DC // GROUP)
        scale_ptr = (row_ptr[:, None] + DC + offs_g[None, :] * 4).to(tl.pointer_type(tl.float32))
        scales = tl.load(scale_ptr, mask=valid[:, None], other=0.0)
        values = tl.reshape(values, [BLOCK_N, DC // GROUP, GROUP]) * scales[:, :, None]
        lat = tl.reshape(values, [BLOCK_N, DC]).to(dtype)
        rope_bytes = row_ptr[:, None] + DC + 4 * (DC // GROUP) + offs_r[None, :] * 2
        k_rope = tl.load(
            rope_bytes.to(tl.pointer_type(tl.bfloat16)), mask=valid[:, None] & mask_r[None, :], other=0.0
        )
        k_rope = k_rope.to(dtype)
    else:
        lat = tl.load(
            latent_ptr + (block * stride_lb + row * stride_lr)[:, None] + offs_c[None, :],
            mask=valid[:, None],
            other=0.0,
        ).to(dtype)
        k_rope = tl.load(
            rope_ptr + (block * stride_rb + row * stride_rr)[:, None] + offs_r[None, :],
            mask=valid[:, None] & mask_r[None, :],
            other=0.0,
        ).to(dtype)
    scores = tl.dot(q_lat, tl.trans(lat), input_precision=PRECISION)
    scores = tl.dot(q_rope, tl.trans(k_rope), scores, input_precision=PRECISION)
    scores = tl.where(valid[None, :], scores * sm_scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: keep exp2 finite
    p = tl.exp2(scores - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(dtype), lat, input_precision=PRECISION)
    m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _mla_split_kernel(
    q_latent_ptr,
    q_rope_ptr,
    latent_ptr,
    rope_ptr,
    block_tables_ptr,
    query_seq_ptr,
    query_pos_ptr,
    topk_ptr,
    out_ptr,
    lse_ptr,
    stride_qlt,
    stride_qlh,
    stride_qrt,
    stride_qrh,
    stride_lb,
    stride_lr,
    stride_rb,
    stride_rr,
    stride_bt,
    stride_kt,
    stride_ot,
    stride_oh,
    stride_os,
    stride_et,
    stride_eh,
    heads,
    num_topk,
    keys_per_split,
    sm_scale_log2,
    PAGE: tl.constexpr,
    DC: tl.constexpr,
    DR: tl.constexpr,
    DRP: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPARSE: tl.constexpr,
    FP8: tl.constexpr,
    DIRECT: tl.constexpr,
    PRECISION: tl.constexpr,
    LOOP_WHILE: tl.constexpr,
    COMPUTE_F32: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    head_group = tl.program_id(1)
    split = tl.program_id(2)
    seq = tl.load(query_seq_ptr + t).to(tl.int64)
    qpos = tl.load(query_pos_ptr + t)

    offs_h = head_group * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < heads
    offs_c = tl.arange(0, DC)
    offs_r = tl.arange(0, DRP)
    q_lat = tl.load(
        q_latent_ptr + t * stride_qlt + offs_h[:, None] * stride_qlh + offs_c[None, :],
        mask=mask_h[:, None],
        other=0.0,
    )
    q_rope = tl.load(
        q_rope_ptr + t * stride_qrt + offs_h[:, None] * stride_qrh + offs_r[None, :],
        mask=mask_h[:, None] & (offs_r < DR)[None, :],
        other=0.0,
    )
    if COMPUTE_F32:  # the interpreter multiplies bf16 / fp16 wrongly: upcast, the math is the same
        q_lat = q_lat.to(tl.float32)
        q_rope = q_rope.to(tl.float32)

    lo = split * keys_per_split
    if SPARSE:
        hi = tl.minimum(lo + keys_per_split, num_topk)
    else:
        hi = tl.minimum(lo + keys_per_split, qpos + 1)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, DC], tl.float32)
    # the interpreter cannot run a for loop over loaded bounds; a while loop is not pipelined on GPU
    if LOOP_WHILE:
        start = lo
        while start < hi:
            m_i, l_i, acc = _mla_tile(
                q_lat, q_rope, m_i, l_i, acc, start, hi, t, seq, latent_ptr, rope_ptr, block_tables_ptr,
                topk_ptr, stride_lb, stride_lr, stride_rb, stride_rr, stride_bt, stride_kt, sm_scale_log2,
                PAGE, DC, DR, DRP, GROUP, BLOCK_N, SPARSE, FP8, PRECISION,
            )  # fmt: skip
            start += BLOCK_N
    else:
        for start in range(lo, hi, BLOCK_N):
            m_i, l_i, acc = _mla_tile(
                q_lat, q_rope, m_i, l_i, acc, start, hi, t, seq, latent_ptr, rope_ptr, block_tables_ptr,
                topk_ptr, stride_lb, stride_lr, stride_rb, stride_rr, stride_bt, stride_kt, sm_scale_log2,
                PAGE, DC, DR, DRP, GROUP, BLOCK_N, SPARSE, FP8, PRECISION,
            )  # fmt: skip

    attended = l_i > 0
    o = acc / tl.where(attended, l_i, 1.0)[:, None]
    lse2 = tl.where(attended, m_i + tl.log2(tl.where(attended, l_i, 1.0)), float("-inf"))
    out_ptrs = out_ptr + t * stride_ot + offs_h[:, None] * stride_oh + offs_c[None, :]
    if DIRECT:
        tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty), mask=mask_h[:, None])
        tl.store(lse_ptr + t * stride_et + offs_h * stride_eh, lse2 * 0.6931471805599453, mask=mask_h)
    else:
        tl.store(out_ptrs + split * stride_os, o, mask=mask_h[:, None])
        tl.store(lse_ptr + t * stride_et + offs_h * stride_eh + split, lse2, mask=mask_h)


@triton.jit
def _mla_combine_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    lse_ptr,
    num_splits,
    stride_pt,
    stride_ph,
    stride_ps,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_et,
    stride_eh,
    DC: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_c = tl.arange(0, DC)
    mask_s = offs_s < num_splits
    lse2 = tl.load(part_lse_ptr + t * stride_qt + h * stride_qh + offs_s, mask=mask_s, other=float("-inf"))
    m = tl.max(lse2, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse2 - m_safe)
    total = tl.sum(w, 0)
    parts = tl.load(
        part_out_ptr + t * stride_pt + h * stride_ph + offs_s[:, None] * stride_ps + offs_c[None, :],
        mask=mask_s[:, None],
        other=0.0,
    )
    o = tl.sum(parts * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    lse = tl.where(
        total > 0, (m_safe + tl.log2(tl.where(total > 0, total, 1.0))) * 0.6931471805599453, float("-inf")
    )
    tl.store(out_ptr + t * stride_ot + h * stride_oh + offs_c, o.to(out_ptr.dtype.element_ty))
    tl.store(lse_ptr + t * stride_et + h * stride_eh, lse)


@functools.lru_cache(maxsize=16)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def default_num_splits(tokens: int, head_groups: int, keys: int, block_n: int, device: torch.device) -> int:
    """Splits per query so that ``tokens * head_groups * splits`` fills the GPU about twice, each
    split keeping at least ``MIN_KEYS_PER_SPLIT`` keys (on CPU: up to 4 splits, to exercise combining)."""
    tiles = max(1, triton.cdiv(keys, block_n))
    if device.type != "cuda":
        return min(4, tiles)
    target = 2 * _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    wanted = triton.cdiv(target, max(1, tokens * head_groups))
    return max(1, min(wanted, triton.cdiv(keys, MIN_KEYS_PER_SPLIT), tiles))


def _launch_mla(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    rope_cache: torch.Tensor | None,
    block_tables: torch.Tensor,
    query_seq: torch.Tensor,
    query_pos: torch.Tensor,
    topk_positions: torch.Tensor | None,
    scale: float,
    max_seq_len: int,
    num_splits: int | None,
    block_n: int | None,
    block_h: int | None,
    num_warps: int | None,
    num_stages: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate, pick tile sizes and splits, launch. Tile arguments: None = the defaults below."""
    fp8 = check_mla_inputs(
        q_latent, q_rope, latent_cache, rope_cache, block_tables, query_seq, query_pos, topk_positions
    )
    tensors = [q_latent, q_rope, latent_cache, block_tables, query_seq, query_pos]
    tensors += [t for t in (rope_cache, topk_positions) if t is not None]
    require_triton_device("paged MLA attention", *tensors)
    tokens, heads, latent_dim = q_latent.shape
    rope_dim = q_rope.shape[2]
    if latent_dim < 16 or latent_dim & (latent_dim - 1):
        raise ValueError(f"paged MLA attention: Dc={latent_dim} must be a power of two >= 16")
    if q_latent.stride(2) != 1 or q_rope.stride(2) != 1 or latent_cache.stride(2) != 1:
        raise ValueError(
            "paged MLA attention: the last dim of q_latent, q_rope and the caches must be contiguous"
        )
    if rope_cache is not None and rope_cache.stride(2) != 1:
        raise ValueError("paged MLA attention: the last dim of rope_cache must be contiguous")
    device = q_latent.device
    out = torch.empty(tokens, heads, latent_dim, dtype=q_latent.dtype, device=device)
    lse = torch.empty(tokens, heads, dtype=torch.float32, device=device)
    if tokens == 0:
        return out, lse
    sparse = topk_positions is not None
    keys = topk_positions.shape[1] if sparse else max_seq_len
    # fp32 tiles are twice as wide in shared memory: halve the key tile so two pipeline stages fit
    block_n = block_n or (16 if device.type != "cuda" or q_latent.element_size() > 2 else 32)
    block_h = block_h or max(16, min(triton.next_power_of_2(heads), 32))
    head_groups = triton.cdiv(heads, block_h)
    if num_splits is None:
        num_splits = default_num_splits(tokens, head_groups, keys, block_n, device)
    num_splits = max(1, num_splits)
    keys_per_split = triton.cdiv(triton.cdiv(max(keys, 1), num_splits), block_n) * block_n
    num_warps = num_warps or (4 if block_h * latent_dim <= 16 * 512 else 8)
    direct = num_splits == 1
    interpreted = device.type != "cuda"
    compute_f32 = interpreted or q_latent.dtype == torch.float32
    if direct:
        dest, dest_lse = out, lse
        stride_os, stride_et, stride_eh = 0, lse.stride(0), lse.stride(1)
    else:
        dest = torch.empty(tokens, heads, num_splits, latent_dim, dtype=torch.float32, device=device)
        dest_lse = torch.empty(tokens, heads, num_splits, dtype=torch.float32, device=device)
        stride_os, stride_et, stride_eh = dest.stride(2), dest_lse.stride(0), dest_lse.stride(1)
    rope = latent_cache if rope_cache is None else rope_cache
    topk = query_pos if topk_positions is None else topk_positions
    _mla_split_kernel[(tokens, head_groups, num_splits)](
        q_latent, q_rope, latent_cache, rope, block_tables, query_seq, query_pos, topk, dest, dest_lse,
        q_latent.stride(0), q_latent.stride(1), q_rope.stride(0), q_rope.stride(1),
        latent_cache.stride(0), latent_cache.stride(1), rope.stride(0), rope.stride(1),
        block_tables.stride(0), topk.stride(0),
        dest.stride(0), dest.stride(1), stride_os, stride_et, stride_eh,
        heads, keys if sparse else 0, keys_per_split, scale * 1.4426950408889634,
        PAGE=latent_cache.shape[1], DC=latent_dim, DR=rope_dim,
        DRP=max(16, triton.next_power_of_2(rope_dim)),
        GROUP=latent_fp8_group_size(latent_dim) if fp8 else latent_dim,
        BLOCK_H=block_h, BLOCK_N=block_n, SPARSE=sparse, FP8=fp8, DIRECT=direct,
        PRECISION="ieee" if compute_f32 else "tf32", LOOP_WHILE=interpreted, COMPUTE_F32=compute_f32,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    if not direct:
        _mla_combine_kernel[(tokens, heads)](
            dest, dest_lse, out, lse, num_splits,
            dest.stride(0), dest.stride(1), dest.stride(2), dest_lse.stride(0), dest_lse.stride(1),
            out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
            DC=latent_dim, BLOCK_S=triton.next_power_of_2(num_splits), num_warps=4,
        )  # fmt: skip
    return out, lse


def paged_mla_decode(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    rope_cache: torch.Tensor | None,
    block_tables: torch.Tensor,
    query_seq: torch.Tensor,
    query_pos: torch.Tensor,
    topk_positions: torch.Tensor | None,
    scale: float,
    max_seq_len: int,
    num_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Absorbed MLA over paged latents, dense causal or DSA sparse, split-K (flash decoding).

    Args:
        q_latent: ``[T, H, Dc]`` queries in the latent space (``q_nope @ W_UK``), fp32 / bf16 / fp16.
        q_rope: ``[T, H, Dr]`` rotated query parts, same dtype.
        latent_cache: ``[num_blocks, B, Dc]`` latents, or ``[num_blocks, B, Dc + 4G + 2Dr]`` uint8 FP8 rows.
        rope_cache: ``[num_blocks, B, Dr]`` rotary keys, or None with FP8 rows.
        block_tables: ``[S, max_blocks]`` int32.
        query_seq: ``[T]`` int32 sequence of each query.
        query_pos: ``[T]`` int32 position of each query; keys ``0 .. query_pos`` must be cached.
        topk_positions: ``[T, K]`` int32 DSA selection (-1 entries skipped), or None for dense causal.
        scale: softmax scale.
        max_seq_len: bound on every ``query_pos + 1`` (sizes the dense grid; fixed per CUDA graph).
        num_splits: key splits per query (None: ``default_num_splits``).

    Returns:
        ``(out [T, H, Dc] in q_latent's dtype, lse [T, H] float32)``; a query with nothing to attend
        gets zeros and ``-inf``. Dc must be a power of two >= 16; Dr may be any width (the kernel
        pads it to a power of two >= 16 in registers with masked loads).
    """
    return _launch_mla(
        q_latent,
        q_rope,
        latent_cache,
        rope_cache,
        block_tables,
        query_seq,
        query_pos,
        topk_positions,
        scale,
        max_seq_len,
        num_splits,
        None,
        None,
        None,
        2,
    )


def paged_mla_prefill(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent_cache: torch.Tensor,
    rope_cache: torch.Tensor | None,
    block_tables: torch.Tensor,
    query_seq: torch.Tensor,
    query_pos: torch.Tensor,
    topk_positions: torch.Tensor | None,
    scale: float,
    max_seq_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill chunks against their cached prefix (causal inside a chunk), absorbed form.

    The same kernel as ``paged_mla_decode`` with one program per query token (no query tiling yet);
    arguments and results as there.
    """
    return _launch_mla(
        q_latent,
        q_rope,
        latent_cache,
        rope_cache,
        block_tables,
        query_seq,
        query_pos,
        topk_positions,
        scale,
        max_seq_len,
        None,
        None,
        None,
        None,
        2,
    )
