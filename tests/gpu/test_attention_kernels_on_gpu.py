"""The paged MLA and DSA indexer Triton kernels compiled for a CUDA GPU (skipped without one): the
tiny cases of ``tests/kernels`` in float32 and bfloat16, and realistic shapes (32 MLA heads over a
512 + 64 latent, 64 x 128 indexer heads, top-2048, block 64), against the float32 references.

Run this file in its own pytest process: with ``TRITON_INTERPRET=1`` set (``tests/kernels`` sets it)
the kernels would be interpreted instead of compiled.
"""

from __future__ import annotations

import os

import pytest
import torch

from kernels.dsa import paged_naive as dsa_naive
from kernels.dsa import paged_triton as dsa_triton
from kernels.mla import paged_naive as mla_naive
from kernels.mla import paged_triton as mla_triton
from tests.kernels.kernel_testing import assert_rel
from tests.kernels.paged_testing import build_cache, random_topk, step_queries

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") == "1", reason="TRITON_INTERPRET=1: run in its own process"
    ),
]
DEVICE = "cuda"
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}

SHAPES = {  # name: (lengths, block, pieces (seq, first position, count), heads, (Dc, Dr, Di), index heads)
    "tiny_ragged": ([1, 17, 40], 4, [(0, 0, 1), (1, 16, 1), (2, 39, 1), (0, 0, 1)], 4, (32, 16, 16), 4),
    "tiny_chunk_after_prefix": ([20, 5, 31], 8, [(0, 13, 7), (1, 0, 5), (2, 30, 1)], 2, (32, 16, 16), 2),
    "real_decode_and_chunk": (
        [1000, 4097, 300, 2500],
        64,
        [(0, 999, 1), (1, 4096, 1), (2, 299, 1), (3, 2436, 64)],
        32,
        (512, 64, 128),
        64,
    ),
}
FORMATS = {
    "fp32": (torch.float32, False),
    "bf16": (torch.bfloat16, False),
    "bf16_fp8rows": (torch.bfloat16, True),
}


@pytest.fixture(autouse=True)
def nan_filled_empty(monkeypatch):
    """Fill every fresh ``torch.empty`` float buffer with NaN, so memory a kernel forgets to write shows."""
    real_empty = torch.empty

    def empty(*args, **kwargs):
        out = real_empty(*args, **kwargs)
        if out.is_floating_point():
            out.fill_(float("nan"))
        return out

    monkeypatch.setattr(torch, "empty", empty)


def make_step(shape: str, fmt: str, seed: int = 0, integer: bool = False):
    torch.manual_seed(seed)
    lengths, block, pieces, heads, dims, index_heads = SHAPES[shape]
    dtype, fp8 = FORMATS[fmt]
    values = (lambda n, d: torch.randint(-2, 3, (n, d)).float()) if integer else None
    cache = build_cache(lengths, block, dims, dtype, fp8, device=DEVICE, values=values)
    query_seq, query_pos = step_queries(pieces, DEVICE)
    return cache, query_seq, query_pos, heads, dims, index_heads, dtype, max(lengths)


@pytest.mark.parametrize("mode", ["dense", "sparse"])
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_paged_mla_on_gpu(shape, fmt, mode):
    cache, query_seq, query_pos, heads, (dc, dr, _), _, dtype, max_len = make_step(shape, fmt)
    tokens = query_seq.numel()
    q_latent = (torch.randn(tokens, heads, dc, device=DEVICE) * dc**-0.25).to(dtype)
    q_rope = (torch.randn(tokens, heads, dr, device=DEVICE) * dr**-0.25).to(dtype)
    topk = (
        random_topk(query_pos.cpu(), 2048 if dc == 512 else 12, seed=1).to(DEVICE)
        if mode == "sparse"
        else None
    )
    scale = 192**-0.5
    args = (
        q_latent,
        q_rope,
        cache.latent,
        cache.rope,
        cache.block_tables,
        query_seq,
        query_pos,
        topk,
        scale,
        max_len,
    )
    want_out, want_lse = mla_naive.paged_mla_decode(*args)
    for name, (out, lse) in {
        "decode": mla_triton.paged_mla_decode(*args),
        "decode_direct": mla_triton.paged_mla_decode(*args, num_splits=1),
        "prefill": mla_triton.paged_mla_prefill(*args),
    }.items():
        assert torch.equal(torch.isinf(lse), torch.isinf(want_lse)), name
        assert_rel(out.float(), want_out.float(), TOL[dtype], f"{name} out")
        finite = torch.isfinite(want_lse)
        assert_rel(lse[finite], want_lse[finite], TOL[dtype], f"{name} lse")


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_paged_indexer_scores_on_gpu(shape, fmt):
    cache, query_seq, query_pos, _, (_, _, di), index_heads, dtype, max_len = make_step(shape, fmt)
    tokens = query_seq.numel()
    q = torch.randn(tokens, index_heads, di, device=DEVICE).to(dtype)
    weights = torch.randn(tokens, index_heads, device=DEVICE) * index_heads**-0.5
    args = (q, weights, cache.index_key, cache.block_tables, query_seq, query_pos, di**-0.5, max_len)
    got, want = dsa_triton.paged_indexer_scores(*args), dsa_naive.paged_indexer_scores(*args)
    visible = torch.arange(max_len, device=DEVICE)[None, :] <= query_pos[:, None]
    assert torch.equal(torch.isfinite(got), visible)
    assert_rel(got[visible], want[visible], TOL[dtype], "scores")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_paged_indexer_topk_exact_on_gpu(shape, dtype):
    """Integer-valued inputs: every score is exact in both paths, ties abound, the top-k must be equal."""
    fmt = "fp32" if dtype == torch.float32 else "bf16"
    cache, query_seq, query_pos, _, (_, _, di), index_heads, _, max_len = make_step(shape, fmt, integer=True)
    tokens = query_seq.numel()
    q = torch.randint(-2, 3, (tokens, index_heads, di), device=DEVICE).to(dtype)
    weights = torch.randint(0, 3, (tokens, index_heads), device=DEVICE).float()
    topk = 2048 if di == 128 else 16
    args = (q, weights, cache.index_key, cache.block_tables, query_seq, query_pos, topk, 1.0, max_len)
    got, want = dsa_triton.paged_indexer_topk(*args), dsa_naive.paged_indexer_topk(*args)
    assert torch.equal(got, want)
