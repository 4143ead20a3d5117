"""Batch-invariant matrix product in Triton: one fixed tiling, one fixed K order, no split-K.

::

    x [M, K]            w [N, K]                 out [M, N]
    ┌──────────┐        ┌──────────┐             program (i, j) owns rows i*BM.., columns j*BN..
    │ BM rows  │ ─┐     │ BN rows  │ ─┐          acc = 0 (float32)
    ├──────────┤  │     ├──────────┤  │          for k0 = 0, BK, 2*BK, ... < K   (always this order)
    │   ...    │  └─dot─┤   ...    │  └─► tile       acc = dot(x[rows, k0:k0+BK], w[cols, k0:k0+BK]^T, acc)
    └──────────┘        └──────────┘             out[rows, cols] = acc (cast once)

The tile shape ``(BM, BN, BK)``, the warp count and the pipeline depth come from the weight's shape and
dtype only (``linear_tiles``), never from M: every launch for one weight compiles to the same kernel,
and each output element is the same sequence of ``dot`` steps over the same K chunks (masked K tails
are exact zeros). A row's bits therefore depend only on that row and ``w``, not on M, on the row's
position inside its BM-row tile, or on the other rows (``M`` is not specialised on either). Where the
batch needs fewer than BM rows the tile is masked, never shrunk: that is the price of invariance on
small batches (decode is bound by reading ``w`` anyway).

Float32 inputs multiply in IEEE float32 (not TF32); bf16/fp16 inputs in the tensor cores with float32
accumulation. Under the Triton interpreter (CPU) the tiles are upcast to float32 (its bf16 dot is wrong)
and each chunk's products are summed over K in index order instead of ``dot`` (``kernels.tile_dot``:
the interpreter's ``dot`` is a BLAS product that may round a row by its place in the tile). The float32
reference is
``kernels.invariant.linear.tree_linear`` (same signature, invariant by construction).
"""

import torch
import triton
import triton.language as tl

from kernels.tile_dot import tile_dot
from kernels.triton_env import require_triton_device


@triton.jit(do_not_specialize=["M"])
def _linear_kernel(
    x,
    w,
    out,
    M,
    N: tl.constexpr,
    K: tl.constexpr,
    stride_xm,
    stride_wn,
    stride_wk: tl.constexpr,
    stride_om,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    o_m = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    o_n = tl.program_id(1) * BN + tl.arange(0, BN)
    m_m = o_m < M
    m_n = o_n < N
    p_x = x + o_m[:, None] * stride_xm
    p_w = w + o_n[None, :].to(tl.int64) * stride_wn
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):  # one order, every launch
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < K
        a = tl.load(p_x + o_k[None, :], mask=m_m[:, None] & m_k[None, :], other=0.0)
        b = tl.load(p_w + o_k[:, None] * stride_wk, mask=m_k[:, None] & m_n[None, :], other=0.0)
        acc = tile_dot(a, b, acc, PRECISION, UPCAST)
    p_o = out + o_m[:, None] * stride_om + o_n[None, :]
    tl.store(p_o, acc.to(out.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])


def linear_tiles(n: int, k: int, dtype: torch.dtype) -> tuple[int, int, int, int, int]:
    """``(BM, BN, BK, num_warps, num_stages)`` for a weight ``[n, k]`` of ``dtype``.

    A function of the weight alone: never of the row count (module docstring). Float32 tiles take a
    shorter BK (twice the bytes per element in shared memory).
    """
    block_n = min(128, max(16, triton.next_power_of_2(n)))
    block_k = min(64 if dtype != torch.float32 else 32, max(16, triton.next_power_of_2(k)))
    return 64, block_n, block_k, 4, 3


def _launch_linear(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> None:
    """``out [M, N] = x [M, K] @ w [N, K]^T``; ``x`` and ``out`` with unit stride over columns."""
    m, k = x.shape
    n = w.shape[0]
    block_m, block_n, block_k, warps, stages = linear_tiles(n, k, w.dtype)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _linear_kernel[grid](
        x, w, out, m, n, k, x.stride(0), w.stride(0), w.stride(1), out.stride(0),
        BM=block_m, BN=block_n, BK=block_k, PRECISION=precision, UPCAST=x.device.type == "cpu",
        num_warps=warps, num_stages=stages,
    )  # fmt: skip


def invariant_linear_triton(
    x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``x @ weight.T`` with float32 accumulation, batch-invariant by construction (module docstring).

    Args:
        x: ``[..., K]`` float32, bfloat16 or float16, any strides.
        weight: ``[N, K]``, any strides. When its dtype differs from ``x``'s both are multiplied in
            float32.
        out_dtype: the result's dtype; None means ``x.dtype``. ``torch.float32`` keeps the float32
            accumulator unrounded (what the invariant numerics' router and MLA absorption read).

    Returns:
        ``[..., N]`` in ``out_dtype``.

    Invariant: a row's bits depend only on that row, ``weight`` and ``out_dtype``: not on the other
    rows, their number, the row's position, or the strides of ``x``.
    """
    require_triton_device("invariant_linear_triton", x, weight)
    k = x.shape[-1]
    if weight.shape[-1] != k:
        raise ValueError(f"weight: expected [N, {k}], got {list(weight.shape)}")
    out_dtype = out_dtype or x.dtype
    if x.dtype != weight.dtype:
        x, weight = x.to(torch.float32), weight.to(torch.float32)
    rows = x.reshape(-1, k)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    n = weight.shape[0]
    out = torch.empty(rows.shape[0], n, dtype=out_dtype, device=x.device)
    if rows.shape[0] > 0 and n > 0:
        _launch_linear(rows, weight, out)
    return out.reshape(*x.shape[:-1], n)
