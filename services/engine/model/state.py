"""Per-sequence cache state for incremental forwards (contiguous, one batch of equal-length rows).

This is the simple reference cache: the engine's paged block pool and KDA state slots hold the same
tensors in packed form. Layer ``i`` keeps either a ``KdaLayerState`` or an ``MlaLayerState``.
"""

from dataclasses import dataclass, field

import torch


@dataclass
class KdaLayerState:
    """``conv [B, 3 * H * K, kernel - 1]`` last inputs of the short conv; ``recurrent [B, H, K, V]`` fp32."""

    conv: torch.Tensor
    recurrent: torch.Tensor


@dataclass
class MlaLayerState:
    """Cached per-token MLA latents ``[B, S, Dc]``, rotary key parts ``[B, S, Dr]`` and, with a DSA
    indexer, index keys ``[B, S, Di]``."""

    latent: torch.Tensor
    k_rope: torch.Tensor
    index_keys: torch.Tensor | None


@dataclass
class SequenceState:
    """Everything a forward needs to continue a batch of sequences of ``num_tokens`` tokens each."""

    num_tokens: int = 0
    layers: dict[int, KdaLayerState | MlaLayerState] = field(default_factory=dict)


def append_tokens(previous: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """Concatenate along the token axis (dim 1); ``previous`` None means nothing cached yet."""
    return new if previous is None else torch.cat([previous, new], dim=1)
