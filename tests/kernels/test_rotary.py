"""Rotary references: frequencies (default, YaRN) vs transformers, both rotation layouts, invariants."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import DeepseekV32Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as hf_ds

from kernels.rotary.naive import (
    RopeScaling,
    apply_rope_half,
    apply_rope_interleaved,
    rope_cos_sin,
    rope_inverse_frequencies,
    yarn_mscale,
)
from tests.kernels.kernel_testing import assert_rel

DEEPSEEK_V3_YARN = dict(
    factor=40.0,
    original_max_position_embeddings=4096,
    beta_fast=32.0,
    beta_slow=1.0,
    mscale=1.0,
    mscale_all_dim=1.0,
)
YARN_CASES = {
    "deepseek_v3": (64, 10000.0, DEEPSEEK_V3_YARN),
    "deepseek_v3_dim128": (128, 10000.0, DEEPSEEK_V3_YARN),
    "mscale_0707": (64, 10000.0, {**DEEPSEEK_V3_YARN, "mscale": 0.707}),
    "no_mscale": (64, 10000.0, {**DEEPSEEK_V3_YARN, "mscale": None, "mscale_all_dim": None}),
    "mscale_without_all_dim": (64, 10000.0, {**DEEPSEEK_V3_YARN, "mscale": 0.707, "mscale_all_dim": None}),
    "explicit_attention_factor": (64, 10000.0, {**DEEPSEEK_V3_YARN, "attention_factor": 1.25}),
    "no_truncate_factor4": (
        64,
        50000.0,
        dict(
            factor=4.0, original_max_position_embeddings=8192, beta_fast=16.0, beta_slow=2.0, truncate=False
        ),
    ),
}


def hf_config(dim: int, theta: float, yarn: dict | None) -> DeepseekV32Config:
    if yarn is None:
        rope = {"rope_type": "default", "rope_theta": theta}
    else:
        rope = {"rope_type": "yarn", "rope_theta": theta, **{k: v for k, v in yarn.items() if v is not None}}
    return DeepseekV32Config(rope_parameters=rope, qk_rope_head_dim=dim, max_position_embeddings=163840)


@pytest.mark.parametrize(
    "dim,theta",
    [(32, 10000.0), (64, 10000.0), (64, 50000.0), (128, 1e6)],
    ids=["d32_t1e4", "d64_t1e4", "d64_t5e4", "d128_t1e6"],
)
def test_default_frequencies_match_transformers(dim, theta):
    inv_freq, factor = rope_inverse_frequencies(dim, theta, None)
    hf_default = hf_ds.DeepseekV32RotaryEmbedding.compute_default_rope_parameters
    hf_inv, hf_factor = hf_default(hf_config(dim, theta, None))
    assert inv_freq.dtype == torch.float32 and inv_freq.shape == (dim // 2,)
    assert factor == hf_factor == 1.0
    assert_rel(inv_freq, hf_inv, 1e-6, "inv_freq")


@pytest.mark.parametrize("case", list(YARN_CASES), ids=list(YARN_CASES))
def test_yarn_frequencies_match_transformers(case):
    dim, theta, yarn = YARN_CASES[case]
    inv_freq, factor = rope_inverse_frequencies(dim, theta, RopeScaling(**yarn))
    hf_inv, hf_factor = ROPE_INIT_FUNCTIONS["yarn"](hf_config(dim, theta, yarn))
    assert math.isclose(factor, hf_factor, rel_tol=1e-12), (factor, hf_factor)
    assert_rel(inv_freq, hf_inv, 1e-6, "inv_freq")
    # YaRN must really act: the fastest channels keep their frequency, the slowest are divided by the factor
    plain, _ = rope_inverse_frequencies(dim, theta, None)
    assert torch.allclose(inv_freq[0], plain[0], rtol=1e-6, atol=0)
    assert torch.allclose(inv_freq[-1], plain[-1] / yarn["factor"], rtol=1e-6, atol=0)


def test_yarn_mscale():
    assert yarn_mscale(1.0) == 1.0 and yarn_mscale(0.5, 3.0) == 1.0
    assert math.isclose(yarn_mscale(40.0, 0.707), 0.1 * 0.707 * math.log(40.0) + 1.0)
    _, factor = rope_inverse_frequencies(64, 1e4, RopeScaling(**{**DEEPSEEK_V3_YARN, "mscale": 0.707}))
    assert math.isclose(factor, yarn_mscale(40.0, 0.707) / yarn_mscale(40.0, 1.0))


# the second YaRN kind has an attention factor != 1 (DeepSeek-V3's mscale == mscale_all_dim gives exactly 1)
ROPE_KINDS = {
    "default": None,
    "yarn": DEEPSEEK_V3_YARN,
    "yarn_mscale_0707": {**DEEPSEEK_V3_YARN, "mscale": 0.707},
}


def _scaling(kind: str) -> RopeScaling | None:
    return None if ROPE_KINDS[kind] is None else RopeScaling(**ROPE_KINDS[kind])


def hf_cos_sin(dim: int, yarn: dict | None, positions: torch.Tensor):
    emb = hf_ds.DeepseekV32RotaryEmbedding(hf_config(dim, 10000.0, yarn))
    return emb(torch.zeros(1, dtype=torch.float32), positions)


@pytest.mark.parametrize("kind", list(ROPE_KINDS), ids=list(ROPE_KINDS))
def test_cos_sin_match_transformers_tables(kind):
    dim = 64
    positions = torch.tensor([[0, 1, 2, 7, 100, 4095, 4096, 70000]])
    inv_freq, factor = rope_inverse_frequencies(dim, 10000.0, _scaling(kind))
    cos, sin = rope_cos_sin(positions, inv_freq, factor, torch.float32)
    hf_cos, hf_sin = hf_cos_sin(dim, ROPE_KINDS[kind], positions)
    assert (factor != 1.0) == (kind == "yarn_mscale_0707")
    assert cos.shape == (1, 8, dim // 2)
    for half in (slice(None, dim // 2), slice(dim // 2, None)):  # transformers duplicates the table
        assert_rel(cos, hf_cos[..., half], 1e-6, "cos")
        assert_rel(sin, hf_sin[..., half], 1e-6, "sin")


def _tables(kind: str, dim: int, positions: torch.Tensor):
    inv_freq, factor = rope_inverse_frequencies(dim, 10000.0, _scaling(kind))
    return rope_cos_sin(positions, inv_freq, factor, torch.float32)


@pytest.mark.parametrize("kind", list(ROPE_KINDS), ids=list(ROPE_KINDS))
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rotation_matches_transformers(layout, kind):
    torch.manual_seed(0)
    batch, seq_len, heads, dim = 2, 6, 3, 64
    positions = torch.randint(0, 5000, (batch, seq_len))
    q, k = torch.randn(batch, seq_len, heads, dim), torch.randn(batch, seq_len, 1, dim)
    cos, sin = _tables(kind, dim, positions)
    hf_cos, hf_sin = hf_cos_sin(dim, ROPE_KINDS[kind], positions)
    ours = apply_rope_interleaved if layout == "interleaved" else apply_rope_half
    theirs = hf_ds.apply_rotary_pos_emb_interleave if layout == "interleaved" else hf_ds.apply_rotary_pos_emb

    q_rot, k_rot = (ours(x, cos[:, :, None], sin[:, :, None]) for x in (q, k))
    hf_q, hf_k = theirs(q.transpose(1, 2), k.transpose(1, 2), hf_cos, hf_sin, unsqueeze_dim=1)
    assert_rel(q_rot, hf_q.transpose(1, 2), 1e-6, "q")
    assert_rel(k_rot, hf_k.transpose(1, 2), 1e-6, "k")


def complex_rotation(x: torch.Tensor, angles: torch.Tensor, layout: str) -> torch.Tensor:
    """Independent float64 reference: pairs as complex numbers times ``exp(i angle)``, de-interleaved."""
    x = x.double()
    half = x.shape[-1] // 2
    re, im = (x[..., 0::2], x[..., 1::2]) if layout == "interleaved" else (x[..., :half], x[..., half:])
    z = torch.complex(re, im) * torch.polar(torch.ones_like(angles), angles)
    return torch.cat([z.real, z.imag], dim=-1)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rotation_matches_complex_multiplication(layout):
    torch.manual_seed(1)
    dim = 16
    positions = torch.arange(0, 40, 3)
    x = torch.randn(len(positions), 2, dim)
    inv_freq, _ = rope_inverse_frequencies(dim, 10000.0, None)
    cos, sin = rope_cos_sin(positions, inv_freq, 1.0, torch.float32)
    fn = apply_rope_interleaved if layout == "interleaved" else apply_rope_half
    angles = positions[:, None, None].double() * inv_freq.double()
    assert_rel(fn(x, cos[:, None], sin[:, None]), complex_rotation(x, angles, layout), 1e-5, "rotated")


@pytest.mark.parametrize("kind", list(ROPE_KINDS), ids=list(ROPE_KINDS))
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rotation_scales_norm_by_attention_factor(layout, kind):
    torch.manual_seed(2)
    dim = 64
    positions = torch.arange(0, 3000, 97)
    inv_freq, factor = rope_inverse_frequencies(dim, 10000.0, _scaling(kind))
    cos, sin = rope_cos_sin(positions, inv_freq, factor, torch.float32)
    x = torch.randn(len(positions), 4, dim)
    fn = apply_rope_interleaved if layout == "interleaved" else apply_rope_half
    assert_rel(fn(x, cos[:, None], sin[:, None]).norm(dim=-1), factor * x.norm(dim=-1), 1e-6, "norm")


@pytest.mark.parametrize("kind", list(ROPE_KINDS), ids=list(ROPE_KINDS))
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_dot_product_depends_only_on_relative_position(layout, kind):
    torch.manual_seed(3)
    dim = 64
    q, k = torch.randn(dim), torch.randn(dim)
    fn = apply_rope_interleaved if layout == "interleaved" else apply_rope_half

    def dot(m: int, n: int) -> torch.Tensor:
        cos, sin = _tables(kind, dim, torch.tensor([m, n]))
        return fn(q, cos[0], sin[0]) @ fn(k, cos[1], sin[1])

    bound = q.norm() * k.norm()
    for m, n in [(5, 0), (9, 9), (3, 20), (31, 2)]:
        base = dot(m, n)
        for shift in (1, 17, 100):
            assert (dot(m + shift, n + shift) - base).abs() <= 1e-4 * bound, (m, n, shift)
    assert (dot(5, 0) - dot(0, 5)).abs() > 1e-3 * bound, "rotation must depend on the offset's sign"
