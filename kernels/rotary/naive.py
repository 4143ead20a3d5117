"""Rotary position embedding references: frequencies (default and YaRN) and the two layouts.

DeepSeek-V3.2's MLA rotates interleaved pairs ``(x0, x1), (x2, x3), ...``; its DSA indexer rotates the
two halves ``(x_i, x_{i + d/2})``. Both return the rotated pairs de-interleaved as
``[first members..., second members...]``; because queries and keys get the same permutation, dot
products are those of the un-permuted rotation, and the cache stores keys in this layout.
"""

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RopeScaling:
    """YaRN context extension parameters (``rope_type == "yarn"``)."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction ``0.1 * mscale * ln(scale) + 1`` (1 when ``scale <= 1``)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def rope_inverse_frequencies(
    dim: int, theta: float, scaling: RopeScaling | None
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies for a rotary dimension.

    Args:
        dim: number of rotated channels (even).
        theta: base wavelength.
        scaling: YaRN parameters, or None for plain RoPE.

    Returns:
        ``(inv_freq [dim // 2] float32, attention_factor)``; the factor multiplies cos and sin.
    """
    exponents = torch.arange(0, dim, 2, dtype=torch.float32) / dim
    pos_freqs = theta**exponents
    if scaling is None:
        return 1.0 / pos_freqs, 1.0
    factor = scaling.factor
    attention_factor = scaling.attention_factor
    if attention_factor is None:
        if scaling.mscale and scaling.mscale_all_dim:
            attention_factor = yarn_mscale(factor, scaling.mscale) / yarn_mscale(
                factor, scaling.mscale_all_dim
            )
        else:
            attention_factor = yarn_mscale(factor)

    def correction_dim(num_rotations: float) -> float:
        wavelength_ratio = scaling.original_max_position_embeddings / (num_rotations * 2 * math.pi)
        return dim * math.log(wavelength_ratio) / (2 * math.log(theta))

    low, high = correction_dim(scaling.beta_fast), correction_dim(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoids a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_weight) + (
        1.0 / pos_freqs
    ) * extrapolation_weight
    return inv_freq, float(attention_factor)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cos and sin tables for given positions.

    Args:
        positions: ``[..., T]`` integer positions.
        inv_freq: ``[dim // 2]``.
        attention_factor: multiplies both tables (YaRN).
        dtype: dtype of the returned tables.

    Returns:
        ``(cos, sin)``, each ``[..., T, dim // 2]``.
    """
    angles = positions[..., None].to(torch.float32) * inv_freq.to(torch.float32)
    return (angles.cos() * attention_factor).to(dtype), (angles.sin() * attention_factor).to(dtype)


def apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs ``(x[2i], x[2i+1])``; output de-interleaved (see module docstring).

    Args:
        x: ``[..., T, H, dim]`` or any shape whose last dim is ``dim`` and whose ``[..., T, :]``
            broadcasts with ``cos`` after the caller unsqueezes the head axis.
        cos, sin: broadcastable to ``x[..., : dim // 2]``.
    """
    first, second = x[..., 0::2], x[..., 1::2]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def apply_rope_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs ``(x[i], x[i + dim/2])`` (the "rotate half" layout of the DSA indexer).

    Args:
        x: ``[..., dim]``.
        cos, sin: broadcastable to ``x[..., : dim // 2]``.
    """
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
