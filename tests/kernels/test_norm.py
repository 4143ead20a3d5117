"""Norm references vs the transformers Kimi-Linear modules and an explicit float64 formula."""

from __future__ import annotations

import pytest
import torch
from transformers.models.kimi_linear import modeling_kimi_linear as hf_kimi

from kernels.norm.naive import gated_rms_norm, layer_norm, rms_norm
from tests.kernels.kernel_testing import assert_rel

EPS = 1e-5
SHAPES = {"tokens_2d": (7, 64), "batch_time_3d": (2, 5, 48), "heads_4d": (2, 3, 4, 32)}


def _weighted(module: torch.nn.Module, dim: int, dtype: torch.dtype) -> torch.nn.Module:
    with torch.no_grad():
        module.weight.copy_(1.0 + 0.5 * torch.randn(dim))
    return module.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_rms_norm_matches_transformers(shape, dtype):
    torch.manual_seed(0)
    module = _weighted(hf_kimi.KimiLinearRMSNorm(shape[-1], eps=EPS), shape[-1], dtype)
    x = (3.0 * torch.randn(shape)).to(dtype)
    with torch.no_grad():
        expected = module(x)
    out = rms_norm(x, module.weight.detach(), EPS)
    assert out.dtype == dtype
    assert torch.equal(out, expected), "same float32 ops as transformers: bitwise"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_gated_rms_norm_matches_transformers(shape, dtype):
    torch.manual_seed(1)
    module = _weighted(hf_kimi.KimiLinearRMSNormGated(shape[-1], eps=EPS), shape[-1], torch.float32)
    x, gate = (3.0 * torch.randn(2, *shape)).to(dtype)
    with torch.no_grad():
        expected = module(x, gate)
    out = gated_rms_norm(x, gate, module.weight.detach(), EPS)
    assert out.dtype == dtype
    assert torch.equal(out, expected), "same float32 ops as transformers: bitwise"


def test_rms_norm_formula_float64():
    torch.manual_seed(2)
    x, weight = torch.randn(4, 6, 40), torch.randn(40)
    xd = x.double()
    expected = weight.double() * xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + EPS)
    assert_rel(rms_norm(x, weight, EPS), expected, 1e-6, "rms_norm")
    gate = torch.randn(4, 6, 40)
    assert_rel(gated_rms_norm(x, gate, weight, EPS), expected * torch.sigmoid(gate.double()), 1e-6, "gated")


def test_eps_matters_for_tiny_inputs():
    x = torch.full((2, 8), 1e-4)
    weight = torch.ones(8)
    # rms(x) = 1e-4, so eps = 1e-5 dominates the mean square 1e-8: the output is far below 1
    out = rms_norm(x, weight, 1e-5)
    assert torch.allclose(out, torch.full_like(out, 1e-4 / (1e-8 + 1e-5) ** 0.5), rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_layer_norm_formula(dtype):
    torch.manual_seed(3)
    x = (2.0 + 3.0 * torch.randn(5, 3, 32)).to(dtype)
    weight, bias = torch.randn(32).to(dtype), torch.randn(32).to(dtype)
    out = layer_norm(x, weight, bias, 1e-6)
    xd = x.double()
    mean, var = xd.mean(-1, keepdim=True), xd.var(-1, unbiased=False, keepdim=True)
    expected = (xd - mean) / torch.sqrt(var + 1e-6) * weight.double() + bias.double()
    assert out.dtype == dtype
    assert_rel(out, expected, 1e-6 if dtype == torch.float32 else 1e-2, "layer_norm")
