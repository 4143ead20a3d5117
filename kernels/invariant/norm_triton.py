"""Batch-invariant row norms in Triton: RMSNorm, gated RMSNorm (KDA), LayerNorm (DSA key norm), L2.

One program per row. A row is read in fixed ``BLOCK``-wide chunks in order; each lane keeps its own
float32 partial sum across chunks and one ``tl.sum`` over the lanes closes the row::

    row of D:    | chunk 0 (BLOCK) | chunk 1 (BLOCK) | chunk 2 (masked tail) |
    lane j:      acc[j] = x[j]^2 + x[BLOCK + j]^2 + x[2 BLOCK + j]^2        (sequential, fixed)
    row total:   tl.sum(acc)                                                 (one fixed tree)

``BLOCK`` and the warp count depend on D only, so every row of every batch runs the same program and
its bits depend only on that row (and the weights): never on the number of rows or the row's place.
Square roots and divisions are the IEEE-rounded ones (``sqrt_rn``, ``div_rn``) to stay close to the
float32 references (``kernels.invariant.norm``, same signatures); invariance would hold either way.
"""

import torch
import triton
import triton.language as tl

from kernels.triton_env import require_triton_device

# Modes of the one row kernel.
_RMS, _GATED_RMS, _LAYER, _L2 = 0, 1, 2, 3


@triton.jit
def _row_sum(p_row, D: tl.constexpr, BLOCK: tl.constexpr, shift, SQUARE: tl.constexpr):
    """``sum((x - shift)^2)`` (SQUARE) or ``sum(x)`` over one row, lanes first, in float32."""
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for d0 in range(0, D, BLOCK):
        o_d = d0 + tl.arange(0, BLOCK)
        m_d = o_d < D
        v = tl.load(p_row + o_d, mask=m_d, other=0.0).to(tl.float32)
        if SQUARE:
            v = tl.where(m_d, v - shift, 0.0)
            acc += v * v
        else:
            acc += v
    return tl.sum(acc, axis=0)


@triton.jit
def _row_norm_kernel(
    x,
    gate,
    weight,
    bias,
    out,
    stride_x,
    stride_g,
    stride_o,
    eps,
    D: tl.constexpr,
    BLOCK: tl.constexpr,
    MODE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    p_x = x + row * stride_x
    if MODE == 2:  # LayerNorm: centre first, then the biased variance of the centred row
        mean = tl.div_rn(_row_sum(p_x, D, BLOCK, 0.0, False), D * 1.0)
        total = _row_sum(p_x, D, BLOCK, mean, True)
    else:
        mean = 0.0
        total = _row_sum(p_x, D, BLOCK, 0.0, True)
    if MODE == 3:
        inv = tl.div_rn(1.0, tl.sqrt_rn(total + eps))
    else:
        inv = tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(total, D * 1.0) + eps))
    for d0 in range(0, D, BLOCK):
        o_d = d0 + tl.arange(0, BLOCK)
        m_d = o_d < D
        v = tl.load(p_x + o_d, mask=m_d, other=0.0).to(tl.float32)
        if MODE == 0:  # weight * (x * inv).to(x.dtype), the product rounded once to out's dtype
            w = tl.load(weight + o_d, mask=m_d, other=0.0).to(tl.float32)
            y = w * (v * inv).to(x.dtype.element_ty).to(tl.float32)
        elif MODE == 1:  # (weight * (x * inv)) * sigmoid(gate), float32, rounded once
            w = tl.load(weight + o_d, mask=m_d, other=0.0).to(tl.float32)
            g = tl.load(gate + row * stride_g + o_d, mask=m_d, other=0.0).to(tl.float32)
            y = (w * (v * inv)) * tl.sigmoid(g)
        elif MODE == 2:  # (x - mean) * inv * weight + bias
            w = tl.load(weight + o_d, mask=m_d, other=0.0).to(tl.float32)
            b = tl.load(bias + o_d, mask=m_d, other=0.0).to(tl.float32)
            y = (v - mean) * inv * w + b
        else:  # x / sqrt(sum x^2 + eps), float32
            y = tl.div_rn(v, tl.sqrt_rn(total + eps))
        tl.store(out + row * stride_o + o_d, y.to(out.dtype.element_ty), mask=m_d)


def norm_block(d: int) -> tuple[int, int]:
    """``(BLOCK, num_warps)`` for rows of ``d`` elements: a function of ``d`` alone."""
    block = min(4096, max(16, triton.next_power_of_2(d)))
    return block, 4 if block <= 1024 else 8


def _launch_row_norm(mode, x, gate, weight, bias, eps, out_dtype) -> torch.Tensor:
    """Rows of ``x [..., D]`` -> ``[..., D]`` in ``out_dtype``; ``gate`` like ``x`` (or None)."""
    d = x.shape[-1]
    rows = x.reshape(-1, d)
    rows = rows if rows.stride(-1) == 1 else rows.contiguous()
    gates = rows
    if gate is not None:
        gates = gate.reshape(-1, d)
        gates = gates if gates.stride(-1) == 1 else gates.contiguous()
    weight = rows if weight is None else weight.contiguous()
    bias = rows if bias is None else bias.contiguous()
    out = torch.empty(rows.shape[0], d, dtype=out_dtype, device=x.device)
    block, warps = norm_block(d)
    if rows.shape[0] > 0:
        _row_norm_kernel[(rows.shape[0],)](
            rows, gates, weight, bias, out, rows.stride(0), gates.stride(0), out.stride(0), float(eps),
            D=d, BLOCK=block, MODE=mode, num_warps=warps,
        )  # fmt: skip
    return out.reshape(x.shape)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, batch-invariant (reference: ``kernels.invariant.norm.invariant_rms_norm``).

    Args:
        x: ``[..., D]`` float32, bfloat16 or float16.
        weight: ``[D]``.
        eps: added to the mean square.

    Returns:
        ``[..., D]`` in ``torch.promote_types(x.dtype, weight.dtype)``: ``weight * (x / rms(x))`` with
        the normalised row rounded to ``x.dtype`` before the weight multiplies it.
    """
    require_triton_device("rms_norm_triton", x, weight)
    out_dtype = torch.promote_types(x.dtype, weight.dtype)
    return _launch_row_norm(_RMS, x, None, weight, None, eps, out_dtype)


def gated_rms_norm_triton(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """KDA's output norm, batch-invariant (reference: ``invariant_gated_rms_norm``).

    Args:
        x: ``[..., D]``.
        gate: ``[..., D]``, same shape as ``x``.
        weight: ``[D]``.
        eps: RMSNorm epsilon.

    Returns:
        ``[..., D]`` in ``x.dtype``: ``weight * norm(x) * sigmoid(gate)`` in float32, rounded once.
    """
    require_triton_device("gated_rms_norm_triton", x, gate, weight)
    if gate.shape != x.shape:
        raise ValueError(f"gate: expected {list(x.shape)}, got {list(gate.shape)}")
    return _launch_row_norm(_GATED_RMS, x, gate, weight, None, eps, x.dtype)


def layer_norm_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm over the last dim (biased variance), batch-invariant (reference: ``invariant_layer_norm``).

    Args:
        x: ``[..., D]``.
        weight, bias: ``[D]``.
        eps: variance epsilon.

    Returns:
        ``[..., D]`` in ``x.dtype``, computed in float32.
    """
    require_triton_device("layer_norm_triton", x, weight, bias)
    return _launch_row_norm(_LAYER, x, None, weight, bias, eps, x.dtype)


def l2_normalize_triton(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim (reference: ``invariant_l2_normalize``).

    Args:
        x: ``[..., D]``.
        eps: added to the sum of squares.

    Returns:
        ``[..., D]`` float32.
    """
    require_triton_device("l2_normalize_triton", x)
    return _launch_row_norm(_L2, x, None, None, None, eps, torch.float32)
