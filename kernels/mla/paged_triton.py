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

Tiles (``MlaKernelConfig``, measured on an H200 with 32 heads, Dc 512, block 64): a dense tile of
``BLOCK_N`` keys inside one cache block costs one scalar block-table load. 32 heads are too few
for Hopper's wgmma (M >= 64), so dense bf16 rows use the heads-minor form (keys are M: scores
``[BLOCK_N, H]``, accumulator ``[Dc, H]``, queries kept in shared memory), 64 keys, 4 warps, 2
stages: 0.5-0.67 of copy bandwidth at batch 32. Dequantised FP8 rows and gathered DSA rows run
faster in the heads-major mma form (64 keys, 8 warps): the FP8 tile, dequantised in registers,
is wanted in two layouts by the heads-minor dots and spills.
"""

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.fp8.naive import latent_fp8_group_size
from kernels.mla.paged_naive import check_mla_inputs
from kernels.mla.paged_rows_triton import mla_row_offsets
from kernels.triton_env import require_triton_device

MIN_KEYS_PER_SPLIT = 256  # a split's partial [H, Dc] fp32 write must stay small beside its key reads


@triton.jit
def _mla_rows(
    lat_off,
    rope_off,
    valid,
    latent_ptr,
    rope_ptr,
    dtype: tl.constexpr,
    DC: tl.constexpr,
    DR: tl.constexpr,
    DRP: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FP8: tl.constexpr,
):
    """The rows at ``lat_off`` / ``rope_off``: ``(latent [BLOCK_N, DC], rope [BLOCK_N, DRP])`` in
    ``dtype`` (FP8 rows dequantised), invalid rows and the rope padding past ``DR`` zero."""
    offs_c = tl.arange(0, DC)
    offs_r = tl.arange(0, DRP)
    rope_mask = valid[:, None] & (offs_r < DR)[None, :]
    if FP8:
        # packed row: DC e4m3 bytes | DC / GROUP fp32 scales | DR bf16 rope (kernels.fp8.naive)
        row_ptr = latent_ptr + lat_off
        offs_g = tl.arange(0, DC // GROUP)
        offs_in = tl.arange(0, GROUP)
        # [BLOCK_N, groups, GROUP] so each group's scale broadcasts over its channels in registers
        raw = tl.load(
            row_ptr[:, None, None] + (offs_g * GROUP)[None, :, None] + offs_in[None, None, :],
            mask=valid[:, None, None],
            other=0,
        )
        scale_row = (row_ptr + DC).to(tl.pointer_type(tl.float32))
        scales = tl.load(
            scale_row[:, None, None] + offs_g[None, :, None], mask=valid[:, None, None], other=0.0
        )
        lat = tl.reshape(raw.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scales, [BLOCK_N, DC]).to(dtype)
        rope_row = (row_ptr + DC + 4 * (DC // GROUP)).to(tl.pointer_type(tl.bfloat16))
        k_rope = tl.load(rope_row[:, None] + offs_r[None, :], mask=rope_mask, other=0.0).to(dtype)
    else:
        lat = tl.load(latent_ptr + lat_off[:, None] + offs_c[None, :], mask=valid[:, None], other=0.0)
        k_rope = tl.load(rope_ptr + rope_off[:, None] + offs_r[None, :], mask=rope_mask, other=0.0)
        lat = lat.to(dtype)
        k_rope = k_rope.to(dtype)
    return lat, k_rope


@triton.jit
def _mla_update(
    q_lat,
    q_rope,
    m_i,
    l_i,
    acc,
    lat,
    k_rope,
    valid,
    sm_scale_log2,
    HEADS_MINOR: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Online-softmax update with one key tile. ``HEADS_MINOR``: scores are ``[BLOCK_N, BLOCK_H]``
    and ``acc`` is ``[DC, BLOCK_H]`` (keys fill the matrix unit's M dimension, which must be >= 64
    for Hopper's wgmma; 32 heads cannot), with ``q_lat [DC, BLOCK_H]``, ``q_rope [DR, BLOCK_H]``;
    otherwise scores ``[BLOCK_H, BLOCK_N]``, ``acc [BLOCK_H, DC]`` and the queries head-major."""
    dtype = lat.dtype
    if HEADS_MINOR:
        s = tl.dot(lat, q_lat, input_precision=PRECISION)
        s = tl.dot(k_rope, q_rope, s, input_precision=PRECISION)
        s = tl.where(valid[:, None], s * sm_scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: keep exp2 finite
        p = tl.exp2(s - m_safe[None, :])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 0)
        acc = acc * alpha[None, :] + tl.dot(tl.trans(lat), p.to(dtype), input_precision=PRECISION)
    else:
        s = tl.dot(q_lat, tl.trans(lat), input_precision=PRECISION)
        s = tl.dot(q_rope, tl.trans(k_rope), s, input_precision=PRECISION)
        s = tl.where(valid[None, :], s * sm_scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(dtype), lat, input_precision=PRECISION)
    return m_new, l_i, acc


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
    PAGE_TILE: tl.constexpr,
    HEADS_MINOR: tl.constexpr,
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
    offs_r = tl.arange(0, DRP)  # the rope width padded to a power of two, masked
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
    dtype = q_lat.dtype

    lo = split * keys_per_split
    if SPARSE:
        hi = tl.minimum(lo + keys_per_split, num_topk)
    else:
        hi = tl.minimum(lo + keys_per_split, qpos + 1)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    if HEADS_MINOR:
        q_lat = tl.trans(q_lat)
        q_rope = tl.trans(q_rope)
        acc = tl.zeros([DC, BLOCK_H], tl.float32)
    else:
        acc = tl.zeros([BLOCK_H, DC], tl.float32)
    # the interpreter cannot run a for loop over loaded bounds; a while loop is not pipelined on GPU
    if LOOP_WHILE:
        start = lo
        while start < hi:
            lat_off, rope_off, valid = mla_row_offsets(
                start, hi, t, seq, block_tables_ptr, topk_ptr, stride_lb, stride_lr, stride_rb, stride_rr,
                stride_bt, stride_kt, PAGE, BLOCK_N, SPARSE, PAGE_TILE,
            )  # fmt: skip
            lat, k_rope = _mla_rows(
                lat_off, rope_off, valid, latent_ptr, rope_ptr, dtype, DC, DR, DRP, GROUP, BLOCK_N, FP8
            )
            m_i, l_i, acc = _mla_update(
                q_lat, q_rope, m_i, l_i, acc, lat, k_rope, valid, sm_scale_log2, HEADS_MINOR, PRECISION
            )
            start += BLOCK_N
    else:
        for start in tl.range(lo, hi, BLOCK_N):
            lat_off, rope_off, valid = mla_row_offsets(
                start, hi, t, seq, block_tables_ptr, topk_ptr, stride_lb, stride_lr, stride_rb, stride_rr,
                stride_bt, stride_kt, PAGE, BLOCK_N, SPARSE, PAGE_TILE,
            )  # fmt: skip
            lat, k_rope = _mla_rows(
                lat_off, rope_off, valid, latent_ptr, rope_ptr, dtype, DC, DR, DRP, GROUP, BLOCK_N, FP8
            )
            m_i, l_i, acc = _mla_update(
                q_lat, q_rope, m_i, l_i, acc, lat, k_rope, valid, sm_scale_log2, HEADS_MINOR, PRECISION
            )

    if HEADS_MINOR:
        acc = tl.trans(acc)
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
    BLOCK_C: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """One (query, head, ``BLOCK_C`` latent channels): splits merged ``BLOCK_S`` at a time, so any
    split count keeps the registers bounded."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    lse_row = part_lse_ptr + t * stride_qt + h * stride_qh
    part_row = part_out_ptr + t * stride_pt + h * stride_ph
    m = tl.full([BLOCK_S], float("-inf"), tl.float32)
    s0 = 0
    while s0 < num_splits:  # a while loop: the interpreter cannot range over a kernel argument
        offs_s = s0 + tl.arange(0, BLOCK_S)
        m = tl.maximum(m, tl.load(lse_row + offs_s, mask=offs_s < num_splits, other=float("-inf")))
        s0 += BLOCK_S
    m_max = tl.max(m, 0)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    total = tl.zeros([BLOCK_S], tl.float32)
    o = tl.zeros([BLOCK_S, BLOCK_C], tl.float32)
    s0 = 0
    while s0 < num_splits:
        offs_s = s0 + tl.arange(0, BLOCK_S)
        mask_s = offs_s < num_splits
        w = tl.exp2(tl.load(lse_row + offs_s, mask=mask_s, other=float("-inf")) - m_safe)
        parts = tl.load(
            part_row + offs_s[:, None] * stride_ps + offs_c[None, :], mask=mask_s[:, None], other=0.0
        )
        total += w
        o += parts * w[:, None]
        s0 += BLOCK_S
    total_all = tl.sum(total, 0)
    o_all = tl.sum(o, 0) / tl.where(total_all > 0, total_all, 1.0)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + offs_c, o_all.to(out_ptr.dtype.element_ty))
    lse = tl.where(
        total_all > 0,
        (m_safe + tl.log2(tl.where(total_all > 0, total_all, 1.0))) * 0.6931471805599453,
        float("-inf"),
    )
    tl.store(lse_ptr + t * stride_et + h * stride_eh, lse, mask=tl.program_id(2) == 0)


@functools.lru_cache(maxsize=16)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@dataclass(frozen=True)
class MlaKernelConfig:
    """Tile shape and schedule of the split kernel (``heads_minor``: see ``_mla_update``)."""

    block_n: int
    num_warps: int
    num_stages: int
    heads_minor: bool


def default_config(device: torch.device, dtype: torch.dtype, fp8: bool, sparse: bool) -> MlaKernelConfig:
    """The tile for the device and row format (see "Tiles" in the module docstring); CPU: small
    fp32 tiles for the interpreter."""
    if device.type != "cuda":
        return MlaKernelConfig(block_n=16, num_warps=4, num_stages=1, heads_minor=False)
    if dtype == torch.float32:  # fp32 tiles are twice as wide in shared memory: small key tiles
        return MlaKernelConfig(block_n=16, num_warps=8, num_stages=2, heads_minor=False)
    if fp8 or sparse:  # dequantised or gathered rows: the heads-major mma tile measured faster
        return MlaKernelConfig(block_n=64, num_warps=8, num_stages=2, heads_minor=False)
    return MlaKernelConfig(block_n=64, num_warps=4, num_stages=2, heads_minor=True)


def default_num_splits(tokens: int, head_groups: int, keys: int, block_n: int, device: torch.device) -> int:
    """Splits per query so that ``tokens * head_groups * splits`` programs fit in one wave (the
    default tiles hold one program per multiprocessor; one program more than the SMs doubles the
    time: batch 32 at 5 splits ran 1.47x slower than at 4 on an H200), each split keeping at least
    ``MIN_KEYS_PER_SPLIT`` keys (on CPU: up to 4 splits, to exercise combining)."""
    tiles = max(1, triton.cdiv(keys, block_n))
    if device.type != "cuda":
        return min(4, tiles)
    target = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    wanted = target // max(1, tokens * head_groups)
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
    config: MlaKernelConfig | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate, pick the tile (``config`` None: ``default_config``) and splits, launch."""
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
    config = config or default_config(device, q_latent.dtype, fp8, sparse)
    block_n = config.block_n
    block_h = max(16, min(triton.next_power_of_2(heads), 32))
    head_groups = triton.cdiv(heads, block_h)
    if num_splits is None:
        num_splits = default_num_splits(tokens, head_groups, keys, block_n, device)
    num_splits = max(1, num_splits)
    keys_per_split = triton.cdiv(triton.cdiv(max(keys, 1), num_splits), block_n) * block_n
    direct = num_splits == 1
    interpreted = device.type != "cuda"
    compute_f32 = interpreted or q_latent.dtype == torch.float32
    page = latent_cache.shape[1]
    if direct:
        dest, dest_lse = out, lse
        stride_os, stride_et, stride_eh = 0, lse.stride(0), lse.stride(1)
    else:
        dest = torch.empty(tokens, heads, num_splits, latent_dim, dtype=torch.float32, device=device)
        dest_lse = torch.empty(tokens, heads, num_splits, dtype=torch.float32, device=device)
        stride_os, stride_et, stride_eh = dest.stride(2), dest_lse.stride(0), dest_lse.stride(1)
    rope = latent_cache if rope_cache is None else rope_cache
    topk = query_pos if topk_positions is None else topk_positions
    group = latent_fp8_group_size(latent_dim) if fp8 else latent_dim
    _mla_split_kernel[(tokens, head_groups, num_splits)](
        q_latent, q_rope, latent_cache, rope, block_tables, query_seq, query_pos, topk, dest, dest_lse,
        q_latent.stride(0), q_latent.stride(1), q_rope.stride(0), q_rope.stride(1),
        latent_cache.stride(0), latent_cache.stride(1), rope.stride(0), rope.stride(1),
        block_tables.stride(0), topk.stride(0),
        dest.stride(0), dest.stride(1), stride_os, stride_et, stride_eh,
        heads, keys if sparse else 0, keys_per_split, scale * 1.4426950408889634,
        PAGE=page, DC=latent_dim, DR=rope_dim, DRP=max(16, triton.next_power_of_2(rope_dim)), GROUP=group,
        BLOCK_H=block_h, BLOCK_N=block_n, SPARSE=sparse, FP8=fp8,
        PAGE_TILE=not sparse and page % block_n == 0, HEADS_MINOR=config.heads_minor, DIRECT=direct,
        PRECISION="ieee" if compute_f32 else "tf32", LOOP_WHILE=interpreted, COMPUTE_F32=compute_f32,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    if not direct:
        block_c = min(latent_dim, 128)
        _mla_combine_kernel[(tokens, heads, latent_dim // block_c)](
            dest, dest_lse, out, lse, num_splits,
            dest.stride(0), dest.stride(1), dest.stride(2), dest_lse.stride(0), dest_lse.stride(1),
            out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
            BLOCK_C=block_c, BLOCK_S=min(16, triton.next_power_of_2(num_splits)), num_warps=4,
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
    config: MlaKernelConfig | None = None,
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
        config: the split kernel's tile (None: ``default_config``; any config gives the same result).

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
        config,
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
    )
