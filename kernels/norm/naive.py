"""RMSNorm, gated RMSNorm and LayerNorm references.

All three normalise in float32 and return the input dtype, the way the Kimi-Linear and DeepSeek-V3.2
reference models do.
"""

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension.

    Args:
        x: ``[..., D]`` any float dtype.
        weight: ``[D]``.
        eps: added to the mean square before the reciprocal square root.

    Returns:
        ``weight * (x / rms(x))`` with the normalisation done in float32 and cast back to ``x.dtype``
        before the weight multiply (the transformers / T5 convention); the product then follows torch
        type promotion, so it is in ``x.dtype`` when ``weight`` has that dtype.
    """
    xf = x.to(torch.float32)
    variance = xf.pow(2).mean(-1, keepdim=True)
    return weight * (xf * torch.rsqrt(variance + eps)).to(x.dtype)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm followed by a sigmoid gate, all in float32 (KDA's output norm).

    Args:
        x: ``[..., D]``.
        gate: ``[..., D]``, same shape as ``x``.
        weight: ``[D]``.
        eps: RMSNorm epsilon.

    Returns:
        ``weight * norm(x) * sigmoid(gate)`` computed in float32, cast to ``x.dtype``.
    """
    xf = x.to(torch.float32)
    variance = xf.pow(2).mean(-1, keepdim=True)
    normed = weight.to(torch.float32) * (xf * torch.rsqrt(variance + eps))
    return (normed * torch.sigmoid(gate.to(torch.float32))).to(x.dtype)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm over the last dimension (the DSA indexer's key norm).

    Args:
        x: ``[..., D]``.
        weight, bias: ``[D]``.
        eps: variance epsilon.
    """
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
