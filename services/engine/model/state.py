"""Per-layer cache state types, and ``ContiguousCache``: the plain-tensor reference ``ModelCache``.

The engine's paged cache holds the same tensors in packed blocks and state slots; this one keeps
each sequence's tensors contiguous and is what full-sequence and test forwards use.
"""

from dataclasses import dataclass

import torch


@dataclass
class KdaLayerState:
    """One sequence's KDA state: ``conv [3 * H * K, kernel - 1]`` last short-conv inputs and
    ``recurrent [H, K, V]`` float32."""

    conv: torch.Tensor
    recurrent: torch.Tensor


@dataclass
class MlaLayerState:
    """One sequence's cached MLA tokens: latents ``[S, Dc]``, rotary key parts ``[S, Dr]`` and, with a
    DSA indexer, index keys ``[S, Di]``."""

    latent: torch.Tensor
    k_rope: torch.Tensor
    index_keys: torch.Tensor | None


class ContiguousCache:
    """``ModelCache`` over plain tensors for a fixed set of sequences.

    Args:
        num_sequences: how many sequences the forwards that use it carry.
    """

    def __init__(self, num_sequences: int):
        self.num_tokens = [0] * num_sequences
        self.layers: list[dict[int, KdaLayerState | MlaLayerState]] = [{} for _ in range(num_sequences)]

    def write_mla(self, layer, seq, latent, k_rope, index_keys):
        previous = self.layers[seq].get(layer)
        if previous is None:
            self.layers[seq][layer] = MlaLayerState(latent, k_rope, index_keys)
            return
        previous.latent = torch.cat([previous.latent, latent])
        previous.k_rope = torch.cat([previous.k_rope, k_rope])
        if index_keys is not None:
            previous.index_keys = torch.cat([previous.index_keys, index_keys])

    def read_mla(self, layer, seq):
        state = self.layers[seq][layer]
        return state.latent, state.k_rope, state.index_keys

    def read_kda(self, layer, seq):
        return self.layers[seq].get(layer)

    def write_kda(self, layer, seq, state):
        self.layers[seq][layer] = state
