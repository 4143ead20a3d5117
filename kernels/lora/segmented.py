"""Segmented LoRA delta in Triton: every row applies its own adapter's pair in one launch.

::

    rows n:      0    1    2    3    4
    slots[n]:    1   -1    0    1    0        (-1: no adapter, the program exits)
    grid (N, M / BN): program (n, j) gathers A[slots[n]] and B[slots[n]] and computes
        h     = x[n] @ A[s]^T          [R]       float32, K in BK steps
        d[j]  = h @ B[s][j-tile]^T     [BN]      float32

A gather-matrix-vector form (one row per program), the shape of decode steps where each row's adapter
differs; the rank R is small, so recomputing ``h`` per output tile costs little. Same math as
``kernels.lora.naive.lora_delta_reference``; not batch-invariant by contract (the batch-invariant mode
uses the fixed-order products, ``services/engine/adapters/merge.py``).
"""

import torch
import triton
import triton.language as tl

from kernels.triton_env import require_triton_device


@triton.jit
def _lora_delta_kernel(
    x,
    a,
    b,
    slots,
    out,
    K: tl.constexpr,
    M: tl.constexpr,
    R: tl.constexpr,
    stride_x,
    stride_as,
    stride_ar,
    stride_bs,
    stride_bm,
    stride_o,
    R_P: tl.constexpr,
    BK: tl.constexpr,
    BN: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots + row).to(tl.int64)
    if slot < 0:
        return
    o_r = tl.arange(0, R_P)
    m_r = o_r < R
    h = tl.zeros([R_P], dtype=tl.float32)
    for k0 in range(0, K, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < K
        xk = tl.load(x + row * stride_x + o_k, mask=m_k, other=0.0).to(tl.float32)
        ak = tl.load(
            a + slot * stride_as + o_r[:, None] * stride_ar + o_k[None, :],
            mask=m_r[:, None] & m_k[None, :],
            other=0.0,
        )
        h += tl.sum(ak * xk[None, :], axis=1)
    o_n = tl.program_id(1) * BN + tl.arange(0, BN)
    m_n = o_n < M
    bt = tl.load(
        b + slot * stride_bs + o_n[:, None] * stride_bm + o_r[None, :],
        mask=m_n[:, None] & m_r[None, :],
        other=0.0,
    )
    d = tl.sum(bt * h[None, :], axis=1)
    tl.store(out + row * stride_o + o_n, d, mask=m_n)


def lora_delta_segmented(
    x: torch.Tensor, slots: torch.Tensor, a_stack: torch.Tensor, b_stack: torch.Tensor
) -> torch.Tensor:
    """Per-row LoRA delta in one launch (see the module docstring).

    Args:
        x: ``[N, K]`` rows, any float dtype (row-contiguous).
        slots: ``[N]`` int, each row's index into the stacks, -1 for none.
        a_stack: ``[S, R, K]`` float32 (ranks zero-padded to R).
        b_stack: ``[S, M, R]`` float32.

    Returns:
        ``[N, M]`` float32, zeros in rows without a slot.
    """
    require_triton_device("lora_delta_segmented", x, slots, a_stack, b_stack)
    n, k = x.shape
    _, rank, _ = a_stack.shape
    m = b_stack.shape[1]
    x = x.contiguous()
    a_stack, b_stack = a_stack.float().contiguous(), b_stack.float().contiguous()
    out = torch.zeros(n, m, dtype=torch.float32, device=x.device)
    if n == 0:
        return out
    bn = min(64, triton.next_power_of_2(m))
    grid = (n, triton.cdiv(m, bn))
    _lora_delta_kernel[grid](
        x,
        a_stack,
        b_stack,
        slots.to(torch.int32).contiguous(),
        out,
        k,
        m,
        rank,
        x.stride(0),
        a_stack.stride(0),
        a_stack.stride(1),
        b_stack.stride(0),
        b_stack.stride(1),
        out.stride(0),
        R_P=max(16, triton.next_power_of_2(rank)),
        BK=min(64, max(16, triton.next_power_of_2(k))),
        BN=bn,
    )
    return out
