"""Batch-invariant elementwise functions in Triton: one launch where ``fixed_elementwise`` makes one per
2048-element block.

An elementwise Triton kernel computes every element with the same instructions whatever its index,
the tensor's size or the launch's shape (there is no vector body and scalar tail as in ATen's CPU
loops), so an element's bits depend only on its value and the function. The float32 references
(same signatures) are the ``fixed_*`` functions of ``kernels.invariant.elementwise``; on the GPU the
two differ by the device's ``exp`` / ``log`` / ``cos`` rounding, never by position.
"""

import torch
import triton
import triton.language as tl

from kernels.triton_env import require_triton_device

UNARY_OPS = ("exp", "log", "sigmoid", "silu", "softplus", "cos", "sin")
_BLOCK = 1024


@triton.jit
def _unary_kernel(x, out, n, OP: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    v = tl.load(x + o, mask=m, other=1.0).to(tl.float32)  # 1.0: a value every op accepts
    if OP == "exp":
        y = tl.exp(v)
    elif OP == "log":
        y = tl.log(v)
    elif OP == "sigmoid":
        y = tl.sigmoid(v)
    elif OP == "silu":
        y = v * tl.sigmoid(v)
    elif OP == "softplus":  # as ``fixed_softplus``: log(1 + exp(x)), x itself above 20
        y = tl.where(v > 20.0, v, tl.log(1.0 + tl.exp(tl.minimum(v, 20.0))))
    elif OP == "cos":
        y = tl.cos(v)
    else:
        y = tl.sin(v)
    tl.store(out + o, y.to(out.dtype.element_ty), mask=m)


def unary_triton(op: str, x: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``op(x)`` elementwise, computed in float32, batch- and position-invariant.

    Args:
        op: one of ``UNARY_OPS``.
        x: ``[...]`` float32, bfloat16 or float16, any strides.
        out_dtype: the result's dtype (the float32 value rounded once).

    Returns:
        ``[...]`` (the shape of ``x``) in ``out_dtype``.
    """
    require_triton_device(f"unary_triton({op})", x)
    if op not in UNARY_OPS:
        raise ValueError(f"op: {op!r} is not one of {', '.join(UNARY_OPS)}")
    flat = x.contiguous().reshape(-1)
    out = torch.empty(flat.shape[0], dtype=out_dtype, device=x.device)
    if flat.numel() > 0:
        _unary_kernel[(triton.cdiv(flat.numel(), _BLOCK),)](flat, out, flat.numel(), OP=op, BLOCK=_BLOCK)
    return out.reshape(x.shape)
