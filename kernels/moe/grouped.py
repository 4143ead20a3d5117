"""Grouped-GEMM MoE in Triton: token-expert pairs sorted by expert on the device, two GEMM launches.

::

    pairs p = n * k + j  (token n, choice j)  ──sort by expert, pad each expert to BM──►
    sorted_pairs [P]:  | e0: p p p . | e2: p p p p | p . . . | e5: ...   (. = padding, M = N*k)
    block_experts [P / BM]: expert of each BM-row block (-1 past the last one)

    gate_up launch, grid (P/BM, I/BN):  h[r]     = silu(x[p//k] @ Wg[e]^T) * (x[p//k] @ Wu[e]^T)
    down launch,    grid (P/BM, D/BN):  y[p]     = weights[p] * (h[r] @ Wd[e]^T)
    combine (sorted, no atomics):       out[n]   = sum_j y[n * k + j]   (float32 sum, j ascending)

P is bounded on the host by ``M + E * (BM - 1)`` so the grid never depends on the routing: blocks past
the used ones exit at once, and nothing waits on the device. Same math as
``kernels.moe.naive.moe_grouped`` (gate rows first in ``w_gate_up``).
"""

import torch
import triton
import triton.language as tl

from kernels.tile_dot import tile_dot
from kernels.triton_env import require_triton_device


def moe_align(
    expert_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort token-expert pairs by expert and pad every expert's run to a multiple of ``block_m``.

    Args:
        expert_ids: ``[N, k]`` expert of each (token, choice); pair ``p = n * k + j``.
        num_experts: E.
        block_m: rows per GEMM block.

    Returns:
        ``(sorted_pairs [P] int32, block_experts [P // block_m] int32, counts [E] int64)`` with
        ``P = N*k + E*(block_m - 1)`` rounded up to ``block_m``; padding rows hold ``N*k``, unused
        blocks expert -1. Pairs of one expert keep increasing p (stable sort). Device ops only.
    """
    flat = expert_ids.reshape(-1).to(torch.int64)
    pairs = flat.shape[0]
    device = flat.device
    capacity = triton.cdiv(pairs + num_experts * (block_m - 1), block_m) * block_m
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_ends = padded.cumsum(0)
    order = torch.sort(flat, stable=True).indices
    sorted_experts = flat[order]
    first_of_expert = counts.cumsum(0) - counts
    rank = torch.arange(pairs, device=device) - first_of_expert[sorted_experts]
    dest = (padded_ends - padded)[sorted_experts] + rank
    sorted_pairs = torch.full((capacity,), pairs, dtype=torch.int32, device=device)
    sorted_pairs.index_copy_(0, dest, order.to(torch.int32))
    block_starts = torch.arange(0, capacity, block_m, device=device)
    block_experts = torch.searchsorted(padded_ends, block_starts, right=True)
    block_experts = torch.where(block_experts < num_experts, block_experts, -1).to(torch.int32)
    return sorted_pairs, block_experts, counts


@triton.jit
def _moe_gate_up_kernel(
    x,
    w,
    h,
    sorted_pairs,
    block_experts,
    num_pairs,
    top_k: tl.constexpr,
    D: tl.constexpr,
    I: tl.constexpr,
    stride_x,
    stride_we,
    stride_wn,
    stride_h,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    block = tl.program_id(0)
    expert = tl.load(block_experts + block).to(tl.int64)
    if expert < 0:
        return
    o_m = block * BM + tl.arange(0, BM)
    pair = tl.load(sorted_pairs + o_m).to(tl.int64)
    m_m = pair < num_pairs
    token = tl.where(m_m, pair // top_k, 0)
    o_n = tl.program_id(1) * BN + tl.arange(0, BN)
    m_n = o_n < I
    p_x = x + token[:, None] * stride_x
    p_g = w + expert * stride_we + o_n[None, :] * stride_wn
    p_u = p_g + I * stride_wn
    acc_g = tl.zeros([BM, BN], dtype=tl.float32)
    acc_u = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, D, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < D
        a = tl.load(p_x + o_k[None, :], mask=m_m[:, None] & m_k[None, :], other=0.0)
        b_g = tl.load(p_g + o_k[:, None], mask=m_k[:, None] & m_n[None, :], other=0.0)
        b_u = tl.load(p_u + o_k[:, None], mask=m_k[:, None] & m_n[None, :], other=0.0)
        # Under the interpreter (UPCAST) in float32, summed in K order: its bf16 dot is wrong, its BLAS
        # rounds a row by its place in the tile (the invariant MoE launches these kernels).
        acc_g = tile_dot(a, b_g, acc_g, PRECISION, UPCAST)
        acc_u = tile_dot(a, b_u, acc_u, PRECISION, UPCAST)
    act = acc_g * tl.sigmoid(acc_g) * acc_u
    tl.store(h + o_m[:, None] * stride_h + o_n[None, :], act.to(h.dtype.element_ty), mask=m_n[None, :])


@triton.jit
def _moe_down_kernel(
    h,
    w,
    y,
    weights,
    sorted_pairs,
    block_experts,
    num_pairs,
    D: tl.constexpr,
    I: tl.constexpr,
    stride_h,
    stride_we,
    stride_wn,
    stride_y,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    block = tl.program_id(0)
    expert = tl.load(block_experts + block).to(tl.int64)
    if expert < 0:
        return
    o_m = block * BM + tl.arange(0, BM)
    pair = tl.load(sorted_pairs + o_m).to(tl.int64)
    m_m = pair < num_pairs
    o_n = tl.program_id(1) * BN + tl.arange(0, BN)
    m_n = o_n < D
    p_h = h + o_m[:, None] * stride_h
    p_w = w + expert * stride_we + o_n[None, :] * stride_wn
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, I, BK):
        o_k = k0 + tl.arange(0, BK)
        m_k = o_k < I
        a = tl.load(p_h + o_k[None, :], mask=m_k[None, :], other=0.0)
        b = tl.load(p_w + o_k[:, None], mask=m_k[:, None] & m_n[None, :], other=0.0)
        acc = tile_dot(a, b, acc, PRECISION, UPCAST)
    scale = tl.load(weights + pair, mask=m_m, other=0.0).to(tl.float32)
    acc = acc * scale[:, None]
    p_y = y + tl.where(m_m, pair, 0)[:, None] * stride_y + o_n[None, :]
    tl.store(p_y, acc.to(y.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])


def _tiles(num_pairs: int, num_experts: int, hidden: int, inter: int) -> tuple[int, int, int, int]:
    """``(BM, BN, BK, num_warps)`` from host shapes only (never the routing)."""
    per_expert = num_pairs / max(1, num_experts)
    block_m = 16 if per_expert <= 16 else 32 if per_expert <= 48 else 64 if per_expert <= 512 else 128
    block_n = min(128, max(16, triton.next_power_of_2(min(hidden, inter))))
    block_k = min(64, max(16, triton.next_power_of_2(min(hidden, inter))))
    return block_m, block_n, block_k, 4 if block_m <= 64 else 8


def _launch_moe(x, expert_ids, weights, w_gate_up, w_down, tiles):
    tokens, hidden = x.shape
    top_k = expert_ids.shape[1]
    num_experts, two_inter, _ = w_gate_up.shape
    inter = two_inter // 2
    num_pairs = tokens * top_k
    block_m, block_n, block_k, warps = tiles
    sorted_pairs, block_experts, _ = moe_align(expert_ids, num_experts, block_m)
    capacity = sorted_pairs.shape[0]
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    upcast = x.device.type == "cpu"
    h = torch.empty(capacity, inter, dtype=x.dtype, device=x.device)
    grid = (capacity // block_m, triton.cdiv(inter, block_n))
    _moe_gate_up_kernel[grid](
        x, w_gate_up, h, sorted_pairs, block_experts, num_pairs, top_k, hidden, inter,
        x.stride(0), w_gate_up.stride(0), w_gate_up.stride(1), h.stride(0),
        BM=block_m, BN=block_n, BK=block_k, PRECISION=precision, UPCAST=upcast, num_warps=warps,
        num_stages=3,
    )  # fmt: skip
    y = torch.empty(num_pairs, hidden, dtype=x.dtype, device=x.device)
    grid = (capacity // block_m, triton.cdiv(hidden, block_n))
    _moe_down_kernel[grid](
        h, w_down, y, weights.reshape(-1), sorted_pairs, block_experts, num_pairs, hidden, inter,
        h.stride(0), w_down.stride(0), w_down.stride(1), y.stride(0),
        BM=block_m, BN=block_n, BK=block_k, PRECISION=precision, UPCAST=upcast, num_warps=warps,
        num_stages=3,
    )  # fmt: skip
    return y.view(tokens, top_k, hidden).sum(dim=1, dtype=torch.float32).to(x.dtype)


def moe_grouped(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
) -> torch.Tensor:
    """SwiGLU experts of every token in two grouped-GEMM launches (Triton), combined by routing weight.

    Args:
        x: ``[N, D]`` activations (bf16 or float32; float32 multiplies in IEEE float32, not TF32).
        expert_ids: ``[N, k]`` chosen experts (append shared experts with
            ``kernels.moe.naive.with_shared_experts`` to compute them in the same launches).
        weights: ``[N, k]`` float32 combine weights.
        w_gate_up: ``[E, 2I, D]`` gate rows then up rows (unit stride over D).
        w_down: ``[E, D, I]`` (unit stride over I).

    Returns:
        ``[N, D]`` in ``x.dtype``: ``sum_j weights[:, j] * down(silu(gate x) * up x)``, each pair's
        product accumulated in float32, the k pairs of a token summed in float32 in choice order.
    """
    require_triton_device("moe_grouped", x)
    if w_gate_up.stride(-1) != 1 or w_down.stride(-1) != 1:
        raise ValueError("w_gate_up, w_down: the last dim must have unit stride")
    x = x.contiguous()
    weights = weights.to(torch.float32).contiguous()
    tiles = _tiles(expert_ids.numel(), w_gate_up.shape[0], x.shape[1], w_down.shape[-1])
    return _launch_moe(x, expert_ids, weights, w_gate_up, w_down, tiles)
