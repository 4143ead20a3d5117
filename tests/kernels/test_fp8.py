"""Packed FP8 KV-cache formats: byte sizes, byte layout decoded by hand, round-trip error bound, edges.

The bound checked per element (derived in ``kernels/fp8/naive.py``), with ``s = amax(|group|) / 448``::

    |x - x_hat| <= (2^-4 + 2^-20) |x| + (2^-10 + 2^-20) s

2^-4 is half of e4m3's relative spacing 2^-3 (round to nearest, 3 mantissa bits); ``2^-10 s`` is half the
subnormal spacing 2^-9 in the scaled domain; the 2^-20 terms cover float32 rounding of ``x / s``,
``q * s`` and of ``s`` itself.
"""

from __future__ import annotations

import struct

import pytest
import torch

from kernels.fp8.naive import (
    SCALE_FLOOR,
    index_key_fp8_bytes,
    latent_fp8_bytes,
    latent_fp8_group_size,
    pack_index_key_fp8,
    pack_latent_fp8,
    unpack_index_key_fp8,
    unpack_latent_fp8,
)

REL_BOUND = 2.0**-4 + 2.0**-20
ABS_BOUND = 2.0**-10 + 2.0**-20  # times the group's scale

# (latent_dim, rope_dim); the odd ones put the scales and rope at offsets not aligned to their size
LATENT_SHAPES = {
    "dc512_dr64": (512, 64),
    "dc256_dr32": (256, 32),
    "dc64_dr16_one_group": (64, 16),
    "dc384_dr0": (384, 0),
    "dc6_dr1_unaligned": (6, 1),
}
INDEX_DIMS = {"di128": 128, "di64": 64, "di3_unaligned": 3}
INPUT_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def _latent_inputs(n: int, latent_dim: int, rope_dim: int, seed: int, magnitude: float = 1.0):
    """Latents whose rows span four orders of magnitude, and rope keys."""
    gen = torch.Generator().manual_seed(seed)
    row_scale = magnitude * 10.0 ** torch.linspace(-2, 2, n).reshape(n, 1) if n else 1.0
    latent = torch.randn(n, latent_dim, generator=gen) * row_scale
    k_rope = torch.randn(n, rope_dim, generator=gen) * 3.0
    return latent, k_rope


def _group_scale(x: torch.Tensor, group: int) -> torch.Tensor:
    """Reference ``max(amax / 448, floor)`` per group, broadcast back to ``[N, D]``, float64."""
    n, d = x.shape
    amax = x.double().reshape(n, d // group, group).abs().amax(-1, keepdim=True)
    return (amax / 448.0).clamp_min(SCALE_FLOOR).expand(n, d // group, group).reshape(n, d)


def assert_within_fp8_bound(x: torch.Tensor, x_hat: torch.Tensor, group: int, what: str) -> None:
    """Per element ``|x - x_hat| <= REL_BOUND |x| + ABS_BOUND s`` with ``s`` the group's scale."""
    x, x_hat_d = x.double(), x_hat.double()
    assert torch.isfinite(x_hat).all(), f"{what}: non-finite values"
    err = (x - x_hat_d).abs()
    limit = REL_BOUND * x.abs() + ABS_BOUND * _group_scale(x, group)
    worst = (err / limit.clamp_min(1e-300)).max().item() if x.numel() else 0.0
    assert (err <= limit).all(), f"{what}: error reaches {worst:.3f} x the e4m3 bound"


def _f32(raw: list[int]) -> float:
    return struct.unpack("<f", bytes(raw))[0]


def _bf16(raw: list[int]) -> float:
    return struct.unpack("<f", bytes([0, 0, *raw]))[0]  # bf16 is the top half of a float32


def _e4m3(byte: int) -> float:
    """Decode one float8_e4m3fn byte: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities."""
    sign = -1.0 if byte & 0x80 else 1.0
    exp, man = (byte >> 3) & 0xF, byte & 0x7
    assert (exp, man) != (0xF, 0x7), "NaN byte"
    if exp == 0:
        return sign * man * 2.0**-9
    return sign * (1 + man / 8) * 2.0 ** (exp - 7)


# ---------------------------------------------------------------------------------------------- sizes


def test_real_model_byte_sizes():
    assert latent_fp8_bytes(512, 64) == 656  # FlashMLA's DeepSeek-V3.2 FP8 row
    assert index_key_fp8_bytes(128) == 132


@pytest.mark.parametrize("shape", list(LATENT_SHAPES), ids=list(LATENT_SHAPES))
def test_latent_byte_size_formula(shape):
    latent_dim, rope_dim = LATENT_SHAPES[shape]
    group = min(128, latent_dim)
    assert latent_fp8_group_size(latent_dim) == group
    assert latent_fp8_bytes(latent_dim, rope_dim) == latent_dim + 4 * (latent_dim // group) + 2 * rope_dim


@pytest.mark.parametrize(
    "latent_dim,rope_dim",
    [(192, 64), (0, 64), (512, -1)],
    ids=["dc192_not_multiple_of_128", "dc0", "dr_negative"],
)
def test_latent_bad_dims_raise(latent_dim, rope_dim):
    with pytest.raises(ValueError):
        latent_fp8_bytes(latent_dim, rope_dim)


def test_bad_inputs_raise():
    with pytest.raises(ValueError):
        index_key_fp8_bytes(0)
    with pytest.raises(ValueError):
        pack_latent_fp8(torch.zeros(2, 512), torch.zeros(3, 64))  # row counts differ
    with pytest.raises(ValueError):
        pack_index_key_fp8(torch.zeros(128))  # not [N, Di]
    packed = pack_latent_fp8(torch.zeros(2, 512), torch.zeros(2, 64))
    with pytest.raises(ValueError):
        unpack_latent_fp8(packed, 512, 32, torch.float32)  # wrong row width
    with pytest.raises(ValueError):
        unpack_index_key_fp8(torch.zeros(2, 132), 128, torch.float32)  # not uint8


# ----------------------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("in_dtype", list(INPUT_DTYPES), ids=list(INPUT_DTYPES))
@pytest.mark.parametrize("shape", list(LATENT_SHAPES), ids=list(LATENT_SHAPES))
def test_latent_round_trip(shape, in_dtype):
    latent_dim, rope_dim = LATENT_SHAPES[shape]
    latent, k_rope = _latent_inputs(37, latent_dim, rope_dim, seed=0)
    latent, k_rope = latent.to(INPUT_DTYPES[in_dtype]), k_rope.to(INPUT_DTYPES[in_dtype])
    packed = pack_latent_fp8(latent, k_rope)
    assert packed.dtype == torch.uint8 and packed.is_contiguous()
    assert packed.shape == (37, latent_fp8_bytes(latent_dim, rope_dim))
    latent_hat, rope_hat = unpack_latent_fp8(packed, latent_dim, rope_dim, torch.float32)
    assert latent_hat.dtype == rope_hat.dtype == torch.float32
    assert torch.equal(rope_hat, k_rope.to(torch.bfloat16).float()), "rope part must be bit-exact bf16"
    assert ((packed[:, :latent_dim] & 0x7F) != 0x7F).all(), "an e4m3 NaN code was stored"
    group = latent_fp8_group_size(latent_dim)
    # each group's amax maps to +-448 exactly, so it comes back up to float32 rounding of / s and * s
    peak = latent.float().reshape(37, -1, group).abs().amax(-1)
    assert torch.allclose(latent_hat.abs().reshape(37, -1, group).amax(-1), peak, rtol=2.0**-22, atol=0)
    assert_within_fp8_bound(latent, latent_hat, latent_fp8_group_size(latent_dim), "latent")


@pytest.mark.parametrize("in_dtype", list(INPUT_DTYPES), ids=list(INPUT_DTYPES))
@pytest.mark.parametrize("dim", list(INDEX_DIMS), ids=list(INDEX_DIMS))
def test_index_key_round_trip(dim, in_dtype):
    index_dim = INDEX_DIMS[dim]
    keys, _ = _latent_inputs(29, index_dim, 0, seed=1)
    keys = keys.to(INPUT_DTYPES[in_dtype])
    packed = pack_index_key_fp8(keys)
    assert packed.dtype == torch.uint8 and packed.shape == (29, index_dim + 4)
    keys_hat = unpack_index_key_fp8(packed, index_dim, torch.float32)
    assert_within_fp8_bound(keys, keys_hat, index_dim, "index key")


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_unpack_dtype_is_a_cast_of_float32(out_dtype):
    latent, k_rope = _latent_inputs(5, 512, 64, seed=2)
    packed = pack_latent_fp8(latent, k_rope)
    ref_latent, ref_rope = unpack_latent_fp8(packed, 512, 64, torch.float32)
    latent_hat, rope_hat = unpack_latent_fp8(packed, 512, 64, out_dtype)
    assert latent_hat.dtype == rope_hat.dtype == out_dtype
    assert torch.equal(latent_hat, ref_latent.to(out_dtype)) and torch.equal(rope_hat, ref_rope.to(out_dtype))
    keys_packed = pack_index_key_fp8(latent[:, :128])
    ref_keys = unpack_index_key_fp8(keys_packed, 128, torch.float32)
    assert torch.equal(unpack_index_key_fp8(keys_packed, 128, out_dtype), ref_keys.to(out_dtype))


def test_zero_rows_and_groups():
    latent = torch.zeros(3, 512)
    latent[1, 128:256] = torch.linspace(-1, 1, 128)  # row 1: only group 1 is non-zero
    k_rope = torch.zeros(3, 64)
    packed = pack_latent_fp8(latent, k_rope)
    latent_hat, rope_hat = unpack_latent_fp8(packed, 512, 64, torch.float32)
    assert torch.equal(latent_hat[[0, 2]], torch.zeros(2, 512)) and torch.equal(rope_hat, k_rope)
    assert torch.equal(latent_hat[1, :128], torch.zeros(128)) and torch.equal(
        latent_hat[1, 256:], torch.zeros(256)
    )
    assert_within_fp8_bound(latent, latent_hat, 128, "latent")
    floor_f32 = torch.tensor(SCALE_FLOOR, dtype=torch.float32).item()
    assert _f32(packed[0, 512:516].tolist()) == floor_f32
    assert _f32(packed[1, 512:516].tolist()) == floor_f32
    assert _f32(packed[1, 516:520].tolist()) == (torch.tensor(1.0) / 448).item()
    keys_hat = unpack_index_key_fp8(pack_index_key_fp8(torch.zeros(2, 128)), 128, torch.float32)
    assert torch.equal(keys_hat, torch.zeros(2, 128))


@pytest.mark.parametrize("magnitude", [1e4, 1e-6], ids=["large_1e4", "tiny_1e-6"])
def test_magnitudes_keep_relative_accuracy(magnitude):
    # rows span magnitude * [1e-2, 1e2]; each group's scale follows its amax, so the relative bound holds
    latent, k_rope = _latent_inputs(16, 512, 64, seed=3, magnitude=magnitude)
    latent_hat, _ = unpack_latent_fp8(pack_latent_fp8(latent, k_rope), 512, 64, torch.float32)
    assert_within_fp8_bound(latent, latent_hat, 128, "latent")
    normal = latent.abs() >= 2.0**-6 * _group_scale(latent, 128)  # e4m3-normal once scaled
    assert normal.float().mean() > 0.99
    rel = ((latent_hat - latent).abs() / latent.abs())[normal]
    assert rel.max() <= REL_BOUND, rel.max()
    keys_hat = unpack_index_key_fp8(pack_index_key_fp8(latent[:, :128]), 128, torch.float32)
    assert_within_fp8_bound(latent[:, :128], keys_hat, 128, "index key")


def test_groups_below_the_scale_floor_keep_the_absolute_bound():
    # amax < 448 * SCALE_FLOOR: the scale is floored and relative precision goes, but the bound holds
    latent, k_rope = _latent_inputs(4, 512, 64, seed=11, magnitude=1e-16)
    latent_hat, _ = unpack_latent_fp8(pack_latent_fp8(latent, k_rope), 512, 64, torch.float32)
    assert_within_fp8_bound(latent, latent_hat, 128, "latent")
    assert (latent_hat - latent).abs().max() <= ABS_BOUND * SCALE_FLOOR + REL_BOUND * latent.abs().max()


def test_outlier_in_one_group_leaves_other_groups_untouched():
    latent, k_rope = _latent_inputs(8, 512, 64, seed=4)
    spiked = latent.clone()
    spiked[:, 130] = 1e4  # group 1 only
    clean = pack_latent_fp8(latent, k_rope)
    packed = pack_latent_fp8(spiked, k_rope)
    others = [*range(0, 128), *range(256, 512)]
    assert torch.equal(packed[:, others], clean[:, others]), "other groups' values changed"
    scale_bytes = [512 + 4 * g + b for g in (0, 2, 3) for b in range(4)]
    assert torch.equal(packed[:, scale_bytes], clean[:, scale_bytes]), "other groups' scales changed"
    latent_hat, _ = unpack_latent_fp8(packed, 512, 64, torch.float32)
    assert_within_fp8_bound(spiked, latent_hat, 128, "latent")


# ------------------------------------------------------------------------------------- layout by hand


def test_latent_bytes_decoded_by_hand():
    latent, k_rope = _latent_inputs(3, 512, 64, seed=5)
    packed = pack_latent_fp8(latent, k_rope)
    latent_hat, _ = unpack_latent_fp8(packed, 512, 64, torch.float32)
    for row in range(3):
        raw = packed[row].tolist()
        scales = [_f32(raw[512 + 4 * g : 516 + 4 * g]) for g in range(4)]  # bytes [512, 528)
        for g in range(4):
            amax = latent[row, 128 * g : 128 * (g + 1)].abs().max()
            assert scales[g] == (amax / 448).item(), (row, g)
        for c in (0, 1, 127, 128, 300, 511):  # bytes [0, 512): e4m3 in channel order
            assert _e4m3(raw[c]) * scales[c // 128] == pytest.approx(latent_hat[row, c].item(), rel=1e-6)
        for r in (0, 1, 63):  # bytes [528, 656): bf16 rope in channel order
            assert _bf16(raw[528 + 2 * r : 530 + 2 * r]) == k_rope[row, r].to(torch.bfloat16).item()


@pytest.mark.parametrize("dim", list(INDEX_DIMS), ids=list(INDEX_DIMS))
def test_index_key_bytes_decoded_by_hand(dim):
    index_dim = INDEX_DIMS[dim]
    keys, _ = _latent_inputs(3, index_dim, 0, seed=6)
    packed = pack_index_key_fp8(keys)
    keys_hat = unpack_index_key_fp8(packed, index_dim, torch.float32)
    for row in range(3):
        raw = packed[row].tolist()
        scale = _f32(raw[index_dim : index_dim + 4])  # the last 4 bytes
        assert scale == (keys[row].abs().max() / 448).item()
        decoded = torch.tensor([_e4m3(b) * scale for b in raw[:index_dim]], dtype=torch.float64)
        assert torch.allclose(decoded, keys_hat[row].double(), rtol=1e-6, atol=0)


# ------------------------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("n", [0, 1], ids=["n0", "n1"])
def test_empty_and_single_row(n):
    latent, k_rope = _latent_inputs(n, 512, 64, seed=7)
    packed = pack_latent_fp8(latent, k_rope)
    assert packed.shape == (n, 656) and packed.dtype == torch.uint8
    latent_hat, rope_hat = unpack_latent_fp8(packed, 512, 64, torch.float32)
    assert latent_hat.shape == (n, 512) and rope_hat.shape == (n, 64)
    assert_within_fp8_bound(latent, latent_hat, 128, "latent")
    keys_packed = pack_index_key_fp8(latent[:, :128])
    assert keys_packed.shape == (n, 132)
    assert unpack_index_key_fp8(keys_packed, 128, torch.float32).shape == (n, 128)


def test_non_contiguous_inputs_and_packed_rows():
    latent, k_rope = _latent_inputs(10, 512, 64, seed=8)
    latent_t = latent.t().contiguous().t()  # column-major
    rope_strided = torch.cat([k_rope, k_rope], dim=-1)[:, ::2]
    rope_strided.copy_(k_rope)
    assert not latent_t.is_contiguous() and not rope_strided.is_contiguous()
    packed = pack_latent_fp8(latent, k_rope)
    assert torch.equal(pack_latent_fp8(latent_t, rope_strided), packed)
    # packed rows read from inside a wider buffer (a block of several kinds) and every other row
    buffer = torch.zeros(10, 3 + 656 + 5, dtype=torch.uint8)
    buffer[:, 3:659] = packed
    for view, rows in ((buffer[:, 3:659], slice(None)), (packed[::2], slice(None, None, 2))):
        latent_hat, rope_hat = unpack_latent_fp8(view, 512, 64, torch.float32)
        ref_latent, ref_rope = unpack_latent_fp8(packed[rows].clone(), 512, 64, torch.float32)
        assert torch.equal(latent_hat, ref_latent) and torch.equal(rope_hat, ref_rope)
    keys = latent[:, ::4]  # [10, 128], stride 4
    keys_packed = pack_index_key_fp8(keys)
    assert torch.equal(keys_packed, pack_index_key_fp8(keys.contiguous()))
    wide = torch.zeros(10, 1 + 132, dtype=torch.uint8)
    wide[:, 1:] = keys_packed
    assert torch.equal(
        unpack_index_key_fp8(wide[:, 1:], 128, torch.float32),
        unpack_index_key_fp8(keys_packed, 128, torch.float32),
    )


def test_pack_is_deterministic_and_row_independent():
    latent, k_rope = _latent_inputs(6, 512, 64, seed=9)
    packed = pack_latent_fp8(latent, k_rope)
    assert torch.equal(packed, pack_latent_fp8(latent, k_rope))
    keys_packed = pack_index_key_fp8(latent[:, :128])
    assert torch.equal(keys_packed, pack_index_key_fp8(latent[:, :128]))
    for i in range(6):  # a row's bytes depend on that row alone
        assert torch.equal(pack_latent_fp8(latent[i : i + 1], k_rope[i : i + 1]), packed[i : i + 1])
        assert torch.equal(pack_index_key_fp8(latent[i : i + 1, :128]), keys_packed[i : i + 1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bytes_match_cpu():
    latent, k_rope = _latent_inputs(64, 512, 64, seed=10)
    latent[3, :128] = 0.0  # a floored scale
    packed = pack_latent_fp8(latent, k_rope)
    packed_cuda = pack_latent_fp8(latent.cuda(), k_rope.cuda())
    assert packed_cuda.is_cuda and torch.equal(packed_cuda.cpu(), packed)
    latent_hat, rope_hat = unpack_latent_fp8(packed_cuda, 512, 64, torch.float32)
    ref_latent, ref_rope = unpack_latent_fp8(packed, 512, 64, torch.float32)
    assert torch.equal(latent_hat.cpu(), ref_latent) and torch.equal(rope_hat.cpu(), ref_rope)
    keys_packed = pack_index_key_fp8(latent[:, :128])
    assert torch.equal(pack_index_key_fp8(latent[:, :128].cuda()).cpu(), keys_packed)
