"""Which cached rows a paged MLA key tile reads: the block-table addressing of ``kernels.paged``
inside a Triton kernel, for ``kernels.mla.paged_triton``'s key tiles."""

import triton
import triton.language as tl


@triton.jit
def mla_row_offsets(
    start,
    hi,
    t,
    seq,
    block_tables_ptr,
    topk_ptr,
    stride_lb,
    stride_lr,
    stride_rb,
    stride_rr,
    stride_bt,
    stride_kt,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPARSE: tl.constexpr,
    PAGE_TILE: tl.constexpr,
):
    """Element offsets of the key rows ``[start, start + BLOCK_N) ∩ [.., hi)`` (dense) or of the
    top-k entries there (sparse) in the latent and rope views: ``(lat_off, rope_off, valid)``, each
    ``[BLOCK_N]``; invalid rows point at row 0 of block 0 (safe to read, masked anyway).

    ``PAGE_TILE``: the tile lies inside one block (dense, ``BLOCK_N`` divides ``PAGE``, tiles start at
    multiples of ``BLOCK_N``): one scalar block-table load, then plain strided rows."""
    idx = start + tl.arange(0, BLOCK_N)
    if SPARSE:
        pos = tl.load(topk_ptr + t * stride_kt + idx, mask=idx < hi, other=-1)
        valid = pos >= 0
        pos = tl.where(valid, pos, 0)
        block = tl.load(block_tables_ptr + seq * stride_bt + pos // PAGE, mask=valid, other=0).to(tl.int64)
        row = (pos % PAGE).to(tl.int64)
    elif PAGE_TILE:
        valid = idx < hi
        block = tl.load(block_tables_ptr + seq * stride_bt + start // PAGE).to(tl.int64)
        row = (start % PAGE) + tl.arange(0, BLOCK_N)
    else:
        valid = idx < hi
        pos = tl.where(valid, idx, 0)
        block = tl.load(block_tables_ptr + seq * stride_bt + pos // PAGE, mask=valid, other=0).to(tl.int64)
        row = (pos % PAGE).to(tl.int64)
    return block * stride_lb + row * stride_lr, block * stride_rb + row * stride_rr, valid
