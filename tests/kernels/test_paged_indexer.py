"""Paged DSA indexer: Triton scores (interpreter on CPU) and the device top-k against their float32
references, exact ties, -1 padding, and the references against today's per-sequence math
(``indexer_scores`` + ``indexer_topk``)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: the kernels run on CPU

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.dsa import paged_naive, paged_triton  # noqa: E402
from kernels.dsa.naive import indexer_scores, indexer_topk  # noqa: E402
from tests.kernels.kernel_testing import assert_rel  # noqa: E402
from tests.kernels.paged_testing import build_cache, step_queries  # noqa: E402

DC, DR, DI = 32, 16, 16
TOL = 1e-4

CASES = {  # name: (sequence lengths, block size, step pieces (seq, first position, count), index heads)
    "decode_ragged_B4_H4": ([1, 17, 40], 4, [(0, 0, 1), (1, 16, 1), (2, 39, 1)], 4),
    "chunk_after_prefix_B8_H2": ([20, 5, 31], 8, [(0, 13, 7), (1, 0, 5), (2, 30, 1)], 2),
    "mixed_order_B16_H3": ([33, 9], 16, [(1, 8, 1), (0, 25, 8)], 3),
}


def small_ints(n: int, d: int) -> torch.Tensor:
    return torch.randint(-2, 3, (n, d)).float()


def make_step(case: str, fp8: bool, integer: bool = False, seed: int = 0, dtype: torch.dtype = torch.float32):
    """Integer-valued inputs (with ``scale = 1``) make every score exact, so ties are real ties."""
    torch.manual_seed(seed)
    lengths, block, pieces, heads = CASES[case]
    cache = build_cache(
        lengths, block, (DC, DR, DI), torch.float32, fp8, values=small_ints if integer else None
    )
    query_seq, query_pos = step_queries(pieces)
    tokens = query_seq.numel()
    if integer:
        q, weights = (
            torch.randint(-2, 3, (tokens, heads, DI)).float(),
            torch.randint(0, 3, (tokens, heads)).float(),
        )
    else:
        q, weights = torch.randn(tokens, heads, DI), torch.randn(tokens, heads)
    return cache, query_seq, query_pos, q.to(dtype), weights, max(lengths)


@pytest.mark.parametrize("fmt", ["fp32", "fp8", "bf16", "bf16_fp8rows"])
@pytest.mark.parametrize("case", list(CASES))
def test_scores_match_reference(case, fmt):
    dtype = torch.bfloat16 if fmt.startswith("bf16") else torch.float32
    cache, query_seq, query_pos, q, weights, max_len = make_step(case, "fp8" in fmt, dtype=dtype)
    args = (q, weights, cache.index_key, cache.block_tables, query_seq, query_pos, DI**-0.5, max_len)
    got, want = paged_triton.paged_indexer_scores(*args), paged_naive.paged_indexer_scores(*args)
    visible = torch.arange(max_len)[None, :] <= query_pos[:, None]
    assert torch.equal(torch.isfinite(got), visible) and torch.equal(torch.isfinite(want), visible)
    assert_rel(got[visible], want[visible], TOL if dtype == torch.float32 else 2e-2, "scores")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("topk", [1, 5, 16, 64], ids=["top1", "top5", "top16", "top64_more_than_visible"])
@pytest.mark.parametrize("case", list(CASES))
def test_topk_is_exact_with_ties(case, topk, dtype):
    cache, query_seq, query_pos, q, weights, max_len = make_step(case, False, integer=True, dtype=dtype)
    args = (q, weights, cache.index_key, cache.block_tables, query_seq, query_pos, topk, 1.0, max_len)
    got, want = paged_triton.paged_indexer_topk(*args), paged_naive.paged_indexer_topk(*args)
    assert got.dtype == torch.int32 and got.shape == (query_seq.numel(), topk)
    scores = paged_naive.paged_indexer_scores(*args[:6], 1.0, max_len)
    finite = scores[torch.isfinite(scores)]
    assert finite.unique().numel() < finite.numel(), "the case must contain ties"
    assert torch.equal(got, want)
    visible = (query_pos + 1).clamp(max=topk)
    assert torch.equal((got >= 0).sum(-1), visible), "one entry per visible key up to topk, then -1"


def test_topk_by_score_rule():
    """Score descending, ties by lower position, -0.0 ties +0.0, -inf never chosen, -1 padding."""
    inf = float("inf")
    scores = torch.tensor(
        [
            [1.0, 3.0, 3.0, -0.0, 0.0, -inf, -2.0],
            [-inf, -inf, 5.0, -inf, -inf, -inf, -inf],
            [0.0, -0.0, 0.0, -1.0, -1.0, 2.5, -inf],
        ]
    )
    want = torch.tensor(
        [[1, 2, 0, 3, 4, 6, -1, -1], [2, -1, -1, -1, -1, -1, -1, -1], [5, 0, 1, 2, 3, 4, -1, -1]]
    )
    for fn in (paged_naive.topk_by_score, paged_triton.topk_by_score):
        assert torch.equal(fn(scores, 8), want.to(torch.int32)), fn.__module__
        assert torch.equal(fn(scores, 3), want[:, :3].to(torch.int32)), fn.__module__


@pytest.mark.parametrize("case", list(CASES))
def test_reference_matches_per_sequence_indexer(case):
    """Each query's positions, as a mask, equal ``indexer_topk(indexer_scores(...))`` over its sequence's
    gathered keys, and come in the order score descending, then position ascending."""
    cache, query_seq, query_pos, q, weights, max_len = make_step(case, False, integer=True)
    topk = 6
    args = (q, weights, cache.index_key, cache.block_tables, query_seq, query_pos)
    got = paged_naive.paged_indexer_topk(*args, topk, 1.0, max_len)
    for t in range(query_seq.numel()):
        seq, pos = int(query_seq[t]), int(query_pos[t])
        keys = cache.rows_index[seq]
        scores = indexer_scores(q[t][None, None], keys[None], weights[t][None, None], 1.0)
        visible = (torch.arange(keys.shape[0]) <= pos)[None, None]
        mask = indexer_topk(scores, visible, topk)[0, 0]
        chosen = got[t][got[t] >= 0].long()
        picked = torch.zeros_like(mask)
        picked[chosen] = True
        assert torch.equal(picked, mask), f"query {t}"
        order = sorted(chosen.tolist(), key=lambda s: (-float(scores[0, 0, s]), s))
        assert chosen.tolist() == order, f"query {t}: order"


def test_cpu_tensors_without_the_interpreter_are_a_clear_error(monkeypatch):
    cache, query_seq, query_pos, q, weights, max_len = make_step("decode_ragged_B4_H4", False)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        paged_triton.paged_indexer_topk(
            q, weights, cache.index_key, cache.block_tables, query_seq, query_pos, 4, 1.0, max_len
        )


def test_bad_key_width_names_the_argument():
    cache, query_seq, query_pos, q, weights, max_len = make_step("decode_ragged_B4_H4", True)
    with pytest.raises(ValueError, match="key_cache must be"):
        paged_triton.paged_indexer_topk(q[..., :8], weights, cache.index_key, cache.block_tables, query_seq,
                                        query_pos, 4, 1.0, max_len)  # fmt: skip
