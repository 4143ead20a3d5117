"""Batch-invariant attention pieces: masked softmax and the probability-weighted sum of values.

Both reduce over keys with ``tree_sum``, whose result does not change when exact zeros are appended
(see ``kernels.invariant.reduce``). Masked keys are forced to probability ``+0.0`` and to a product
of ``+0.0``, so a query over keys ``[0, t]`` gives the same bits whether the key list ends at ``t``
or is padded with any number of masked keys after it::

    keys          0 .. t | t+1 .. S-1
    valid         1 .. 1 | 0 ..... 0      (contents of masked keys are ignored, even NaN)
    p             same   | +0.0
    sum_s p v     same bits for any S > t
"""

import torch

from kernels.invariant.elementwise import fixed_exp
from kernels.invariant.reduce import tree_sum

# Bound on the [..., T, S, D] product tensor ``invariant_weighted_sum`` materialises (16 MiB float32).
_CHUNK_ELEMENTS = 1 << 22


def invariant_softmax(scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim restricted to ``valid`` positions, in float32.

    Args:
        scores: ``[..., S]`` any float dtype; values at invalid positions are ignored (may be NaN/inf).
        valid: ``[..., S]`` bool, broadcastable to ``scores``.

    Returns:
        ``[..., S]`` float32 probabilities; exactly ``+0.0`` at invalid positions, and all zeros for a
        row with no valid position.

    Invariants (bitwise): a row depends only on its own valid scores and their positions. The max
    is exact; ``exp`` goes through ``fixed_exp``; the denominator is a ``tree_sum`` over the row, so
    appending masked positions at the end of a row changes nothing at the valid ones.
    """
    s = scores.to(torch.float32)
    valid = valid.expand_as(s)
    row_max = torch.where(valid, s, float("-inf")).amax(-1, keepdim=True)
    shifted = torch.where(valid, s - row_max, 0.0)
    e = torch.where(valid, fixed_exp(shifted), 0.0)
    denom = tree_sum(e, -1, keepdim=True)
    return torch.where(denom > 0, e / denom, 0.0)


def invariant_weighted_sum(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``out[t] = sum_s p[t, s] * v[s]`` with a ``tree_sum`` over ``s``, in float32.

    Args:
        p: ``[..., T, S]`` weights (attention probabilities), any float dtype.
        v: ``[..., S, D]`` values; leading dims broadcast against ``p``'s.

    Returns:
        ``[..., T, D]`` float32.

    Invariants (bitwise): ``out[t]`` depends only on ``p[t]`` and ``v``, not on T or the other rows
    (chunking over T to bound memory cannot change it). A key with ``p == 0`` contributes exactly
    ``+0.0`` whatever ``v`` holds there (NaN from an unwritten cache slot included), so with
    ``invariant_softmax`` padding the key list with masked keys at the end never changes a bit.
    """
    pf = p.to(torch.float32)
    vf = v.to(torch.float32)
    s_len, d = vf.shape[-2:]
    t_chunk = max(1, _CHUNK_ELEMENTS // max(s_len * d, 1))
    chunks = []
    for start in range(0, pf.shape[-2], t_chunk):
        w = pf[..., start : start + t_chunk, :, None]
        prod = torch.where(w == 0, 0.0, w * vf[..., None, :, :])
        chunks.append(tree_sum(prod, -2))
    if not chunks:
        batch = torch.broadcast_shapes(pf.shape[:-2], vf.shape[:-2])
        return torch.zeros(*batch, 0, d, dtype=torch.float32, device=p.device)
    return torch.cat(chunks, -2)
