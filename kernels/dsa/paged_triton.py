"""Paged DSA lightning indexer in Triton: scores for every query of a step, then a device top-k.

Same math, arguments and results as ``kernels.dsa.paged_naive`` (read its docstring first). Two
stages, neither reading anything back to the host::

    scores kernel, grid (T, ceil(W / BLOCK_N)):  one query x BLOCK_N key positions; the key tile
        [BLOCK_N, Di] (gathered through the block table, FP8 bytes converted exactly) meets all Hi
        heads in one dot [Hi, Di] x [Di, BLOCK_N], then relu, weights, sum over heads -> [T, W] fp32
        (-inf after query_pos)
    top-k: one int64 sort key per position, (order-preserving score bits) << 32 | (2^32 - 1 - position),
        so torch.topk's order is exactly score descending, then position ascending

``W = max(max_seq_len, topk)``. FP8 keys: ``q . (k8 * s) = (q . k8) * s``, so the kernel multiplies
the e4m3 values (exact in bf16) and applies the row scale to the dot product.
"""

import torch
import triton
import triton.language as tl

from kernels.dsa.paged_naive import check_indexer_inputs
from kernels.triton_env import require_triton_device


@triton.jit
def _indexer_scores_kernel(
    q_ptr,
    weights_ptr,
    key_ptr,
    block_tables_ptr,
    query_seq_ptr,
    query_pos_ptr,
    out_ptr,
    stride_qt,
    stride_qh,
    stride_wt,
    stride_kb,
    stride_kr,
    stride_bt,
    stride_ot,
    heads,
    width,
    scale,
    PAGE: tl.constexpr,
    DI: tl.constexpr,
    BLOCK_HI: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FP8: tl.constexpr,
    PRECISION: tl.constexpr,
    COMPUTE_F32: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    seq = tl.load(query_seq_ptr + t).to(tl.int64)
    qpos = tl.load(query_pos_ptr + t)
    pos = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    valid = pos <= qpos
    offs_h = tl.arange(0, BLOCK_HI)
    offs_d = tl.arange(0, DI)
    mask_h = offs_h < heads
    q = tl.load(
        q_ptr + t * stride_qt + offs_h[:, None] * stride_qh + offs_d[None, :], mask=mask_h[:, None], other=0.0
    )
    w = tl.load(weights_ptr + t * stride_wt + offs_h, mask=mask_h, other=0.0).to(tl.float32)
    if COMPUTE_F32:  # the interpreter multiplies bf16 / fp16 wrongly: upcast, the math is the same
        q = q.to(tl.float32)

    safe = tl.where(valid, pos, 0)
    block = tl.load(block_tables_ptr + seq * stride_bt + safe // PAGE, mask=valid, other=0).to(tl.int64)
    row_ptr = key_ptr + block * stride_kb + (safe % PAGE).to(tl.int64) * stride_kr
    raw = tl.load(row_ptr[:, None] + offs_d[None, :], mask=valid[:, None], other=0)
    if FP8:
        keys = raw.to(tl.float8e4nv, bitcast=True).to(q.dtype)  # e4m3 values are exact in bf16 / fp32
    else:
        keys = raw.to(q.dtype)
    dots = tl.dot(q, tl.trans(keys), input_precision=PRECISION)  # [BLOCK_HI, BLOCK_N]
    if FP8:
        key_scale = tl.load((row_ptr + DI).to(tl.pointer_type(tl.float32)), mask=valid, other=0.0)
        dots = dots * key_scale[None, :]
    per_head = tl.maximum(dots * scale, 0.0) * w[:, None]
    scores = tl.where(valid, tl.sum(per_head, 0), float("-inf"))
    tl.store(out_ptr + t * stride_ot + pos, scores, mask=pos < width)


def _launch_indexer_scores(
    q: torch.Tensor,
    weights: torch.Tensor,
    key_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_seq: torch.Tensor,
    query_pos: torch.Tensor,
    scale: float,
    width: int,
    block_n: int | None,
    num_warps: int,
) -> torch.Tensor:
    """Validate and launch the scores kernel into a fresh ``[T, width]`` float32 buffer."""
    fp8 = check_indexer_inputs(q, weights, key_cache, block_tables, query_seq, query_pos)
    require_triton_device("paged DSA indexer", q, weights, key_cache, block_tables, query_seq, query_pos)
    tokens, heads, index_dim = q.shape
    if index_dim < 16 or index_dim & (index_dim - 1):
        raise ValueError(f"paged DSA indexer: Di={index_dim} must be a power of two >= 16")
    if q.stride(2) != 1 or key_cache.stride(2) != 1:
        raise ValueError("paged DSA indexer: the last dim of q and key_cache must be contiguous")
    out = torch.empty(tokens, width, dtype=torch.float32, device=q.device)
    if tokens == 0 or width == 0:
        return out
    block_n = block_n or (64 if q.device.type == "cuda" else 16)
    compute_f32 = q.device.type != "cuda" or q.dtype == torch.float32
    _indexer_scores_kernel[(tokens, triton.cdiv(width, block_n))](
        q, weights, key_cache, block_tables, query_seq, query_pos, out,
        q.stride(0), q.stride(1), weights.stride(0), key_cache.stride(0), key_cache.stride(1),
        block_tables.stride(0), out.stride(0), heads, width, scale,
        PAGE=key_cache.shape[1], DI=index_dim, BLOCK_HI=max(16, triton.next_power_of_2(heads)),
        BLOCK_N=block_n, FP8=fp8, PRECISION="ieee" if compute_f32 else "tf32", COMPUTE_F32=compute_f32,
        num_warps=num_warps,
    )  # fmt: skip
    return out


def paged_indexer_scores(
    q: torch.Tensor,
    weights: torch.Tensor,
    key_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_seq: torch.Tensor,
    query_pos: torch.Tensor,
    scale: float,
    max_seq_len: int,
) -> torch.Tensor:
    """Index scores ``[T, max_seq_len]`` float32 (-inf after each ``query_pos``); arguments as in
    ``kernels.dsa.paged_naive.paged_indexer_scores``. Di must be a power of two >= 16."""
    return _launch_indexer_scores(
        q, weights, key_cache, block_tables, query_seq, query_pos, scale, max_seq_len, None, 4
    )


def topk_by_score(scores: torch.Tensor, topk: int) -> torch.Tensor:
    """``[T, topk]`` int32 positions of the best finite scores, score descending then position
    ascending, -1 padded (the rule of ``kernels.dsa.paged_naive.topk_by_score``), on the device.

    ``-0.0`` counts as ``+0.0`` (as the float comparison of the reference sort does).
    """
    tokens, width = scores.shape
    if topk > width:
        scores = torch.cat([scores, scores.new_full((tokens, topk - width), float("-inf"))], dim=1)
    bits = (scores + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into +0.0
    ordered = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(torch.int64)  # monotone in the score
    positions = torch.arange(scores.shape[1], device=scores.device, dtype=torch.int64)
    key = ordered * (1 << 32) + ((1 << 32) - 1 - positions)
    best = torch.topk(key, topk, dim=-1, largest=True, sorted=True).indices
    finite = scores.gather(-1, best) > float("-inf")
    return torch.where(finite, best, -1).to(torch.int32)


def paged_indexer_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    key_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_seq: torch.Tensor,
    query_pos: torch.Tensor,
    topk: int,
    scale: float,
    max_seq_len: int,
) -> torch.Tensor:
    """The DSA selection of every query, ``[T, topk]`` int32 (see the module docstring).

    Args:
        q: ``[T, Hi, Di]`` indexer queries (rotated), fp32 / bf16 / fp16.
        weights: ``[T, Hi]`` float32 per-head weights.
        key_cache: ``[num_blocks, B, Di]`` keys (q's dtype), or ``[num_blocks, B, Di + 4]`` uint8 FP8 rows.
        block_tables: ``[S, max_blocks]`` int32.
        query_seq: ``[T]`` int32 sequence of each query.
        query_pos: ``[T]`` int32 position of each query; keys ``0 .. query_pos`` must be cached.
        topk: the budget (``index_topk``).
        scale: dot-product scale (``Di ** -0.5``).
        max_seq_len: bound on every ``query_pos + 1`` (sizes the grid; fixed per CUDA graph).

    Returns:
        ``[T, topk]`` int32 positions, score descending then position ascending, -1 padded.
    """
    width = max(max_seq_len, topk)
    scores = _launch_indexer_scores(
        q, weights, key_cache, block_tables, query_seq, query_pos, scale, width, None, 4
    )
    return topk_by_score(scores, topk)
