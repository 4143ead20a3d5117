"""Batch-invariant reduction: a pairwise halving tree with a fixed shape.

``tree_sum`` pads the reduced dim to a power of two and adds the upper half onto the lower half
until one element is left::

    n = 5, padded to 8 with -0.0:   [a b c d e 0 0 0]
    step 1 (+ upper half):          [a+e  b+0  c+0  d+0]
    step 2:                         [(a+e)+(c+0)  (b+0)+(d+0)]
    step 3:                         [((a+e)+(c+0)) + ((b+0)+(d+0))]

Every step is a plain elementwise ``+`` (IEEE, correctly rounded, no FMA), so the value of each
output depends only on its own slice of the input and on the padded length, never on the other
rows of the tensor, on how torch vectorises or threads the adds, or on memory layout.
"""

import torch


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def tree_sum(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """Sum over ``dim`` in a fixed pairwise order, in float32.

    Args:
        x: ``[..., n, ...]`` any float dtype; ``n = x.shape[dim]`` is reduced.
        dim: the reduced dimension.
        keepdim: keep ``dim`` with size 1.

    Returns:
        float32 sums with ``dim`` removed (or size 1). An empty dim sums to ``+0.0``.

    Invariants (bitwise):
        * each sum depends only on its own ``n`` inputs: not on other rows, batch size, thread count
          or strides, because the tree's shape is a function of ``n`` alone;
        * appending exact zeros (``+0.0`` or ``-0.0``) at the end of the reduced dim never changes a
          result. Padding to a power of two uses ``-0.0``, the exact additive identity
          (``v + -0.0 == v`` for every ``v``, including ``+0.0``). Trailing zeros beyond ``n`` only
          ever meet other values as ``v + 0``, which equals ``v`` up to the sign of a zero, and sums
          of operands that agree up to zero signs agree up to zero signs; the final ``+ 0.0``
          maps ``-0.0`` to ``+0.0``, so zero results are canonical too. This is what lets a query
          over ``t + 1`` keys and the same query over a longer key list, whose masked products
          are exactly zero, give the same bits. Zeros *between* the inputs change the tree and are
          not covered.
    """
    xf = x.to(torch.float32)
    dim = dim % xf.dim()
    n = xf.shape[dim]
    width = _next_pow2(n)
    if width > n:
        pad_shape = list(xf.shape)
        pad_shape[dim] = width - n
        xf = torch.cat([xf, torch.full(pad_shape, -0.0, dtype=torch.float32, device=xf.device)], dim)
    while width > 1:
        width //= 2
        xf = xf.narrow(dim, 0, width) + xf.narrow(dim, width, width)
    # ``-0.0 + 0.0 == +0.0`` and ``v + 0.0 == v`` otherwise: one canonical zero (see Invariants).
    out = xf + 0.0
    return out if keepdim else out.squeeze(dim)
