"""Batch-invariant MoE experts in Triton: fixed-tile grouped GEMMs, then a combine in expert-id order.

::

    pairs sorted by expert (``kernels.moe.grouped.moe_align``, BM rows per block, BM a constant)
    gate_up launch:  h[r] = silu(x[p // k] @ Wg[e]^T) * (x[p // k] @ Wu[e]^T)      (fixed BN, BK, K order)
    down launch:     y[p] = weights[p] * (h[r] @ Wd[e]^T)
    combine:         out[n] = sum of y[n, j] over the token's k choices in increasing expert id,
                     float32, left to right, rounded once

The GEMM kernels are ``kernels.moe.grouped``'s, launched here with tiles that depend on the weights
only (that module picks BM by the tokens per expert, so a row there may change bits with the batch):
each pair's row is the same dot sequence over the same K chunks whatever shares its BM-row block. The
combine reads only the token's own k rows, in an order fixed by its expert ids. A token's bits thus
depend only on the token, its routing and the weights. Float32 reference (same signature):
``kernels.moe.naive.moe_experts``.
"""

import torch
import triton
import triton.language as tl

from kernels.moe.grouped import _moe_down_kernel, _moe_gate_up_kernel, moe_align
from kernels.triton_env import require_triton_device

BLOCK_M = 32  # pairs per GEMM block: a constant, never derived from the routing or the batch


@triton.jit
def _combine_kernel(y, order, out, stride_y, stride_o, D: tl.constexpr, K: tl.constexpr, BD: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    o_d = tl.program_id(1) * BD + tl.arange(0, BD)
    m_d = o_d < D
    acc = tl.zeros([BD], dtype=tl.float32)
    for j in tl.static_range(K):  # the token's choices in increasing expert id
        choice = tl.load(order + n * K + j).to(tl.int64)
        acc += tl.load(y + (n * K + choice) * stride_y + o_d, mask=m_d, other=0.0).to(tl.float32)
    tl.store(out + n * stride_o + o_d, acc.to(out.dtype.element_ty), mask=m_d)


def moe_tiles(hidden: int, inter: int) -> tuple[int, int, int, int]:
    """``(BM, BN, BK, num_warps)`` from the expert weights' shape only."""
    block_n = min(128, max(16, triton.next_power_of_2(min(hidden, inter))))
    block_k = min(64, max(16, triton.next_power_of_2(min(hidden, inter))))
    return BLOCK_M, block_n, block_k, 4


def moe_experts_triton(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
) -> torch.Tensor:
    """SwiGLU experts of every token, combined in expert-id order, batch-invariant by construction.

    Args:
        x: ``[N, D]`` activations (float32 multiplies in IEEE float32; bf16 / fp16 in the tensor cores).
        expert_ids: ``[N, k]`` chosen experts, distinct within a token.
        weights: ``[N, k]`` combine weights (read as float32).
        w_gate_up: ``[E, 2I, D]`` gate rows then up rows (unit stride over D).
        w_down: ``[E, D, I]`` (unit stride over I).

    Returns:
        ``[N, D]`` in ``x.dtype``.
    """
    require_triton_device("moe_experts_triton", x, expert_ids, weights, w_gate_up, w_down)
    if w_gate_up.stride(-1) != 1 or w_down.stride(-1) != 1:
        raise ValueError("w_gate_up, w_down: the last dim must have unit stride")
    tokens, hidden = x.shape
    top_k = expert_ids.shape[1]
    num_experts, two_inter, _ = w_gate_up.shape
    inter = two_inter // 2
    num_pairs = tokens * top_k
    out = torch.empty(tokens, hidden, dtype=x.dtype, device=x.device)
    if num_pairs == 0:
        return out.zero_()
    x = x.contiguous()
    weights = weights.to(torch.float32).contiguous()
    block_m, block_n, block_k, warps = moe_tiles(hidden, inter)
    sorted_pairs, block_experts, _ = moe_align(expert_ids, num_experts, block_m)
    capacity = sorted_pairs.shape[0]
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    upcast = x.device.type == "cpu"
    h = torch.empty(capacity, inter, dtype=x.dtype, device=x.device)
    _moe_gate_up_kernel[(capacity // block_m, triton.cdiv(inter, block_n))](
        x, w_gate_up, h, sorted_pairs, block_experts, num_pairs, top_k, hidden, inter,
        x.stride(0), w_gate_up.stride(0), w_gate_up.stride(1), h.stride(0),
        BM=block_m, BN=block_n, BK=block_k, PRECISION=precision, UPCAST=upcast, num_warps=warps, num_stages=3,
    )  # fmt: skip
    y = torch.empty(num_pairs, hidden, dtype=x.dtype, device=x.device)
    _moe_down_kernel[(capacity // block_m, triton.cdiv(hidden, block_n))](
        h, w_down, y, weights.reshape(-1), sorted_pairs, block_experts, num_pairs, hidden, inter,
        h.stride(0), w_down.stride(0), w_down.stride(1), y.stride(0),
        BM=block_m, BN=block_n, BK=block_k, PRECISION=precision, UPCAST=upcast, num_warps=warps, num_stages=3,
    )  # fmt: skip
    order = torch.sort(expert_ids, dim=-1, stable=True).indices.to(torch.int32).contiguous()
    block_d = min(1024, triton.next_power_of_2(hidden))
    _combine_kernel[(tokens, triton.cdiv(hidden, block_d))](
        y, order, out, y.stride(0), out.stride(0), D=hidden, K=top_k, BD=block_d
    )
    return out
