"""Normalisation modules holding their weights; the math lives in ``kernels.norm.naive``."""

import torch
from torch import nn

from kernels.norm.naive import gated_rms_norm, layer_norm, rms_norm


class RMSNorm(nn.Module):
    """RMSNorm over the last dim (``weight [D]``)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class GatedRMSNorm(nn.Module):
    """RMSNorm times ``sigmoid(gate)``, in float32 (KDA output norm, ``weight [D]``)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm(x, gate, self.weight, self.eps)


class LayerNorm(nn.Module):
    """LayerNorm with weight and bias (DSA indexer key norm)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps)
