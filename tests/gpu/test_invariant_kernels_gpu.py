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


def test_latent_attention_indexer_and_moe_real_shapes_are_batch_invariant():
    """32 MLA heads over a 512 + 64 latent and 2000 cached keys, 64 x 128 indexer heads, 64 experts of
    a K3-width MoE (top-8): one query / token alone vs the last of a 300-row batch, bitwise."""
    from kernels.invariant.attention_triton import mla_latent_attention_reference, mla_latent_attention_triton
    from kernels.invariant.indexer_triton import indexer_scores_reference, indexer_scores_triton
    from kernels.invariant.moe_triton import moe_experts_triton

    tokens, keys = 300, 2000
    q_lat, q_rope = _randn(tokens, 32, 512, dtype=torch.float32, seed=8), _randn(tokens, 32, 64, seed=9)
    latent, k_rope = _randn(keys, 512, seed=10), _randn(keys, 64, seed=11)
    counts = torch.randint(1, keys, (tokens,), device=DEVICE)
    index = torch.arange(keys, device=DEVICE).repeat(tokens, 1)
    got = mla_latent_attention_triton(q_lat, q_rope, latent, k_rope, 0.05, index, counts)
    want = mla_latent_attention_reference(q_lat[:4], q_rope[:4], latent, k_rope, 0.05, index[:4], counts[:4])
    assert_rel(got[:4], want, 1e-4)
    alone = mla_latent_attention_triton(
        q_lat[-1:], q_rope[-1:], latent, k_rope, 0.05, index[-1:], counts[-1:]
    )
    assert torch.equal(_bits(alone), _bits(got[-1:])), "attention: last query alone"

    q, k, w = _randn(tokens, 64, 128, seed=12), _randn(keys, 128, seed=13), _randn(tokens, 64, seed=14)
    scores = indexer_scores_triton(q, k, w, 128**-0.5)
    assert_rel(scores[:4], indexer_scores_reference(q[:4], k, w[:4], 128**-0.5), 1e-4)
    alone = indexer_scores_triton(q[-1:], k[:1000], w[-1:], 128**-0.5)
    assert torch.equal(_bits(alone), _bits(scores[-1:, :1000])), "indexer: last query alone, fewer keys"

    x = _randn(tokens, HIDDEN, seed=15)
    ids = torch.stack([torch.randperm(64, device=DEVICE)[:8] for _ in range(tokens)])
    weights = torch.rand(tokens, 8, device=DEVICE)
    w_gate_up = _randn(64, 2 * 1024, HIDDEN, seed=16) * HIDDEN**-0.5
    w_down = _randn(64, HIDDEN, 1024, seed=17) * 1024**-0.5
    out = moe_experts_triton(x, ids, weights, w_gate_up, w_down)
    alone = moe_experts_triton(x[-1:], ids[-1:], weights[-1:], w_gate_up, w_down)
    assert torch.equal(_bits(alone), _bits(out[-1:])), "moe: last token alone"
