"""Batch-invariant elementwise functions.

ATen's CPU unary kernels run a vectorised loop over whole SIMD chunks and a scalar loop over the
tail; for ``sigmoid``, ``silu`` and ``softplus`` the two paths round differently, so an element's bits
depend on where it falls relative to the end of the tensor (or of a thread's share of it). Which
elements form the tail changes with the batch size.

``fixed_elementwise`` removes that dependence: the input is flattened and padded to a whole number
of fixed ``ELEMENTWISE_BLOCK``-element blocks, and the function is called once per block on a
contiguous slice of identical shape. The block is a multiple of every SIMD chunk (so there is no
tail at all) and well under the grain size at which ATen splits a kernel across threads (so each
call is single-threaded and no thread boundary makes a tail). SIMD lanes do not interact, so every
element takes the vector path with the same arithmetic wherever it sits. (``exp`` and ``log`` were
measured invariant already; they go through the same blocks so that no op relies on that.)
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F

# A multiple of the vector loop's unrolled step (2 x 16 float lanes on AVX-512, so no scalar tail) and
# far under TensorIterator's 32768-element grain (so one thread runs each call).
ELEMENTWISE_BLOCK = 2048


def fixed_elementwise(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, pad_value: float = 0.0
) -> torch.Tensor:
    """Apply an elementwise ``fn`` so every element goes through the same code path.

    Args:
        fn: elementwise float32 function (``out[i]`` depends only on ``in[i]``).
        x: ``[...]`` any float dtype; computed in float32.
        pad_value: fills the last block; must be a value ``fn`` accepts (it never reaches the output).

    Returns:
        ``fn(x)`` in float32, shape of ``x``.

    Invariant: an element's bits depend only on its own value, not on the tensor's size, shape,
    strides, the element's position or the thread count.
    """
    flat = x.to(torch.float32).reshape(-1)
    n = flat.numel()
    blocks = -(-n // ELEMENTWISE_BLOCK)
    padded = torch.full((blocks * ELEMENTWISE_BLOCK,), pad_value, dtype=torch.float32, device=x.device)
    padded[:n] = flat
    out = torch.zeros_like(padded)
    for start in range(0, padded.numel(), ELEMENTWISE_BLOCK):
        out[start : start + ELEMENTWISE_BLOCK] = fn(padded[start : start + ELEMENTWISE_BLOCK])
    return out[:n].reshape(x.shape)


def fixed_exp(x: torch.Tensor) -> torch.Tensor:
    """``exp(x)`` in float32, position-invariant (see ``fixed_elementwise``)."""
    return fixed_elementwise(torch.exp, x)


def fixed_log(x: torch.Tensor) -> torch.Tensor:
    """``log(x)`` in float32, position-invariant (see ``fixed_elementwise``)."""
    return fixed_elementwise(torch.log, x, pad_value=1.0)


def fixed_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """``sigmoid(x)`` in float32, position-invariant (see ``fixed_elementwise``)."""
    return fixed_elementwise(torch.sigmoid, x)


def fixed_silu(x: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(x)`` (``F.silu``) in float32, position-invariant (see ``fixed_elementwise``)."""
    return fixed_elementwise(F.silu, x)


def fixed_softplus(x: torch.Tensor) -> torch.Tensor:
    """``where(x > 20, x, log(1 + exp(x)))`` in float32 (the fla / KDA forget-gate softplus).

    Built from ``fixed_exp`` and ``fixed_log`` plus correctly rounded ``+``, so position-invariant.
    Note ``log(1 + exp(x))`` rounds to 0 below about -17, as the KDA reference does (``F.softplus``
    uses ``log1p`` there).
    """
    xf = x.to(torch.float32)
    return torch.where(xf > 20.0, xf, fixed_log(1.0 + fixed_exp(xf)))
