"""Rotary embedding tables for a model's rotary dimension (DeepSeek-V3.2; Kimi's MLA is NoPE)."""

import torch

from kernels.rotary.naive import rope_inverse_frequencies

from .config import RopeConfig
from .numerics import Numerics


class RotaryTables:
    """Computes ``(cos, sin)`` for positions; both ``[..., T, dim // 2]``.

    Args:
        rope: theta and optional YaRN scaling.
        dim: rotated channels (``qk_rope_head_dim``).
    """

    def __init__(self, rope: RopeConfig, dim: int):
        # Computed on the CPU even while the model is built on the meta device; moved per call.
        with torch.device("cpu"):
            self.inv_freq, self.attention_factor = rope_inverse_frequencies(dim, rope.theta, rope.scaling)
        # One copy per device, made on first use: a step must not copy from the host (CUDA graphs).
        self._on_device: dict[torch.device, torch.Tensor] = {}

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype, nx: Numerics
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if positions.device not in self._on_device:
            self._on_device[positions.device] = self.inv_freq.to(positions.device)
        return nx.rope_cos_sin(positions, self._on_device[positions.device], self.attention_factor, dtype)
