"""Normalisation modules holding their weights; the math comes from the forward's ``Numerics``."""

import torch
from torch import nn

from .numerics import Numerics


class RMSNorm(nn.Module):
    """RMSNorm over the last dim (``weight [D]``)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, nx: Numerics) -> torch.Tensor:
        return nx.rms_norm(x, self.weight, self.eps)


class GatedRMSNorm(nn.Module):
    """RMSNorm times ``sigmoid(gate)``, in float32 (KDA output norm, ``weight [D]``)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor, nx: Numerics) -> torch.Tensor:
        return nx.gated_rms_norm(x, gate, self.weight, self.eps)


class LayerNorm(nn.Module):
    """LayerNorm with weight and bias (DSA indexer key norm)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, nx: Numerics) -> torch.Tensor:
        return nx.layer_norm(x, self.weight, self.bias, self.eps)
