"""The batch-invariant Triton kernels compiled for a CUDA GPU (skipped without one), at K3 shapes: each
against its float32 reference, and a row's bits alone vs inside batches of many sizes (decode and
prefill token counts, across the matmul's 64-row tiles), compared as integers. The tiny cases of
``tests/kernels/device/test_invariant_triton.py`` run compiled there too when a GPU is visible.

Run this file in its own pytest process: with ``TRITON_INTERPRET=1`` set (``tests/kernels`` sets it)
the kernels would be interpreted instead of compiled.
"""

from __future__ import annotations

import os

import pytest
import torch

from kernels.invariant.linear import tree_linear
from kernels.invariant.linear_triton import invariant_linear_triton
from kernels.invariant.norm import invariant_gated_rms_norm, invariant_rms_norm
from kernels.invariant.norm_triton import gated_rms_norm_triton, rms_norm_triton
from kernels.invariant.softmax_triton import log_softmax_reference, log_softmax_triton
from tests.kernels.kernel_testing import assert_rel

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") == "1", reason="TRITON_INTERPRET=1: run in its own process"
    ),
]
DEVICE = "cuda"
HIDDEN, GATE_UP, VOCAB, HEAD_DIM = 2304, 2 * 9216, 163840, 128
BATCHES = (1, 2, 3, 7, 16, 63, 64, 65, 257, 1000)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({4: torch.int32, 2: torch.int16}[t.element_size()])


def _assert_rows_invariant(fn, pool: torch.Tensor) -> None:
    """Each of the first 8 pool rows: its bits alone equal its bits at the end of every batch size."""
    probe = pool[:8]
    alone = torch.cat([fn(probe[i : i + 1]) for i in range(probe.shape[0])])
    for size in BATCHES:
        for i in range(probe.shape[0]):
            batch = torch.cat([pool[8 : 8 + size - 1], probe[i : i + 1]])
            got = fn(batch)[-1:]
            same = _bits(got) == _bits(alone[i : i + 1])
            assert bool(same.all()), f"row {i} last of {size}: {int((~same).sum())} elements differ"


def _randn(*shape, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return torch.randn(*shape, generator=g, device=DEVICE).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_matmul_real_shape_matches_reference_and_is_batch_invariant(dtype):
    w = _randn(GATE_UP, HIDDEN, dtype=dtype, seed=1) * HIDDEN**-0.5
    pool = _randn(8 + max(BATCHES), HIDDEN, dtype=dtype, seed=2)
    assert_rel(
        invariant_linear_triton(pool[:8], w).float(),
        tree_linear(pool[:8], w),
        1e-5 if dtype == torch.float32 else 2e-2,
    )
    _assert_rows_invariant(lambda rows: invariant_linear_triton(rows, w), pool)
    _assert_rows_invariant(lambda rows: invariant_linear_triton(rows, w, torch.float32), pool)


def test_norms_real_shape_match_reference_and_are_batch_invariant():
    weight = _randn(HIDDEN, seed=3)
    pool = _randn(8 + max(BATCHES), HIDDEN, seed=4)
    assert_rel(
        rms_norm_triton(pool, weight, 1e-6).float(), invariant_rms_norm(pool, weight, 1e-6).float(), 2e-2
    )
    _assert_rows_invariant(lambda rows: rms_norm_triton(rows, weight, 1e-6), pool)
    heads = _randn(8 + max(BATCHES), 2 * HEAD_DIM, seed=5)
    head_weight = _randn(HEAD_DIM, seed=6)

    def gated(rows):
        return gated_rms_norm_triton(rows[:, :HEAD_DIM], rows[:, HEAD_DIM:], head_weight, 1e-6)

    want = invariant_gated_rms_norm(heads[:, :HEAD_DIM], heads[:, HEAD_DIM:], head_weight, 1e-6)
    assert_rel(gated(heads).float(), want.float(), 2e-2)
    _assert_rows_invariant(gated, heads)


def test_log_softmax_full_vocab_matches_reference_and_is_batch_invariant():
    pool = _randn(8 + 64, VOCAB, dtype=torch.float32, seed=7) * 3
    assert_rel(log_softmax_triton(pool[:4]), log_softmax_reference(pool[:4]), 1e-5)
    probe = pool[:8]
    alone = torch.cat([log_softmax_triton(probe[i : i + 1]) for i in range(8)])
    for size in (1, 2, 7, 64):
        batch = torch.cat([pool[8 : 8 + size - 1], probe[3:4]])
        assert torch.equal(_bits(log_softmax_triton(batch)[-1:]), _bits(alone[3:4])), f"last of {size}"
