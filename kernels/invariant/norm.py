"""Batch-invariant row norms: RMSNorm, gated RMSNorm, L2 normalisation, LayerNorm.

Same semantics (float32 compute, returned dtype) as ``kernels/norm/naive.py`` and
``kernels.kda.naive.l2_normalize``, built only from ``tree_sum``, ``fixed_sigmoid`` and correctly
rounded elementwise ``+ - * / sqrt``, so each row's bits depend only on that row (and the shared
weights), never on the batch. ``rsqrt`` is written ``1 / sqrt``: both steps are IEEE correctly
rounded, so no vector/scalar path can disagree. Not bitwise equal to the references (their
``mean`` / ``sum`` reduce in another order), only close.
"""

import torch

from kernels.invariant.elementwise import fixed_sigmoid
from kernels.invariant.reduce import tree_sum


def _inv_rms(xf: torch.Tensor, eps: float) -> torch.Tensor:
    """``1 / sqrt(mean(x^2) + eps)`` over the last dim, ``[..., 1]``."""
    variance = tree_sum(xf * xf, -1, keepdim=True) / xf.shape[-1]
    return 1.0 / torch.sqrt(variance + eps)


def invariant_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension, batch-invariant.

    Args:
        x: ``[..., D]`` any float dtype.
        weight: ``[D]``.
        eps: added to the mean square before the reciprocal square root.

    Returns:
        ``weight * (x / rms(x))``: normalised in float32, cast to ``x.dtype``, then multiplied by
        ``weight`` under torch type promotion (as ``kernels.norm.naive.rms_norm``).

    Invariant: each row's bits depend only on that row, ``weight`` and ``eps``.
    """
    xf = x.to(torch.float32)
    return weight * (xf * _inv_rms(xf, eps)).to(x.dtype)


def invariant_gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """RMSNorm times ``sigmoid(gate)``, all in float32 (KDA's output norm), batch-invariant.

    Args:
        x: ``[..., D]``.
        gate: ``[..., D]``, same shape as ``x``.
        weight: ``[D]``.
        eps: RMSNorm epsilon.

    Returns:
        ``weight * norm(x) * sigmoid(gate)`` in float32, cast to ``x.dtype``
        (as ``kernels.norm.naive.gated_rms_norm``).

    Invariant: each row's bits depend only on that row of ``x`` and ``gate``, ``weight`` and ``eps``;
    the sigmoid goes through ``fixed_sigmoid``.
    """
    xf = x.to(torch.float32)
    normed = weight.to(torch.float32) * (xf * _inv_rms(xf, eps))
    return (normed * fixed_sigmoid(gate)).to(x.dtype)


def invariant_l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim, float32 (as ``kernels.kda.naive.l2_normalize``).

    Args:
        x: ``[..., D]`` any float dtype.
        eps: added to the sum of squares.

    Returns:
        ``[..., D]`` float32.

    Invariant: each row's bits depend only on that row and ``eps``.
    """
    xf = x.to(torch.float32)
    return xf / torch.sqrt(tree_sum(xf * xf, -1, keepdim=True) + eps)


def invariant_layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """LayerNorm over the last dimension (the DSA indexer's key norm), batch-invariant.

    Args:
        x: ``[..., D]`` any float dtype.
        weight, bias: ``[D]``.
        eps: variance epsilon.

    Returns:
        ``(x - mean) / sqrt(var + eps) * weight + bias`` computed in float32 (biased variance, as
        ``F.layer_norm``), cast to ``x.dtype``. Multiply and add stay separate ops (no FMA).

    Invariant: each row's bits depend only on that row, ``weight``, ``bias`` and ``eps``.
    """
    xf = x.to(torch.float32)
    d = xf.shape[-1]
    centred = xf - tree_sum(xf, -1, keepdim=True) / d
    variance = tree_sum(centred * centred, -1, keepdim=True) / d
    normed = centred * (1.0 / torch.sqrt(variance + eps))
    return (normed * weight.to(torch.float32) + bias.to(torch.float32)).to(x.dtype)
