"""DSA lightning indexer: scores vs a triple loop, top-k selection vs a brute-force per-row reference."""

from __future__ import annotations

import pytest
import torch

from kernels.dsa.naive import indexer_scores, indexer_topk
from tests.kernels.kernel_testing import assert_rel


def scores_loop(q, k, weights, scale) -> torch.Tensor:
    """``I[b, t, s] = sum_h w[b, t, h] * relu(scale * q[b, t, h] . k[b, s])`` one entry at a time, float64."""
    batch, queries, heads, _ = q.shape
    keys = k.shape[1]
    out = torch.zeros(batch, queries, keys, dtype=torch.float64)
    for b in range(batch):
        for t in range(queries):
            for s in range(keys):
                total = 0.0
                for h in range(heads):
                    dot = float(q[b, t, h].double() @ k[b, s].double())
                    total += float(weights[b, t, h]) * max(scale * dot, 0.0)
                out[b, t, s] = total
    return out


@pytest.mark.parametrize(
    "shape",
    [(1, 1, 9, 2, 8), (2, 5, 7, 4, 16), (1, 3, 12, 8, 32)],
    ids=["decode_B1_H2", "B2_T5_H4", "B1_T3_H8"],
)
def test_scores_match_triple_loop(shape):
    torch.manual_seed(0)
    batch, queries, keys, heads, dim = shape
    q = torch.randn(batch, queries, heads, dim)
    k = torch.randn(batch, keys, dim)
    weights = torch.randn(batch, queries, heads)
    scale = dim**-0.5

    scores = indexer_scores(q, k, weights, scale)
    assert scores.dtype == torch.float32 and scores.shape == (batch, queries, keys)
    assert_rel(scores, scores_loop(q, k, weights, scale), 1e-6, "scores")


def test_scores_accept_bf16_inputs():
    torch.manual_seed(1)
    q = torch.randn(1, 4, 2, 16, dtype=torch.bfloat16)
    k = torch.randn(1, 6, 16, dtype=torch.bfloat16)
    weights = torch.randn(1, 4, 2, dtype=torch.bfloat16)
    scores = indexer_scores(q, k, weights, 0.25)
    assert scores.dtype == torch.float32
    assert_rel(scores, scores_loop(q, k, weights, 0.25), 1e-6, "scores")


def topk_reference(scores: torch.Tensor, visible: torch.Tensor, topk: int) -> torch.Tensor:
    """Per row: visible keys sorted by (-score, position), first ``min(topk, visible)`` of them."""
    selected = torch.zeros_like(visible)
    for b in range(scores.shape[0]):
        for t in range(scores.shape[1]):
            candidates = [s for s in range(scores.shape[2]) if visible[b, t, s]]
            candidates.sort(key=lambda s: (-float(scores[b, t, s]), s))
            for s in candidates[:topk]:
                selected[b, t, s] = True
    return selected


def causal_visible(batch: int, queries: int, keys: int) -> torch.Tensor:
    q_pos = torch.arange(keys - queries, keys)[:, None]
    return (torch.arange(keys)[None, :] <= q_pos).expand(batch, queries, keys).clone()


def random_visible(batch: int, queries: int, keys: int) -> torch.Tensor:
    """Random visibility with some rows nearly empty and one row fully hidden (a padding query)."""
    visible = torch.rand(batch, queries, keys) < 0.5
    visible[0, 0] = False
    visible[0, 0, keys // 2] = True  # a single visible key
    visible[0, 1] = False  # no visible key at all
    return visible


VISIBILITY = {"causal_prefill": causal_visible, "random": random_visible}
SCORES = {
    "continuous": lambda shape: torch.randn(shape),
    "integer_ties": lambda shape: torch.randint(0, 4, shape).float(),
    "all_equal": lambda shape: torch.ones(shape),
}


@pytest.mark.parametrize("topk", [1, 4, 11, 32], ids=lambda k: f"topk{k}")
@pytest.mark.parametrize("scores_kind", list(SCORES), ids=list(SCORES))
@pytest.mark.parametrize("visibility", list(VISIBILITY), ids=list(VISIBILITY))
def test_topk_matches_brute_force(visibility, scores_kind, topk):
    torch.manual_seed(2)
    batch, queries, keys = 2, 20, 20
    scores = SCORES[scores_kind]((batch, queries, keys))
    visible = VISIBILITY[visibility](batch, queries, keys)

    selected = indexer_topk(scores, visible, topk)
    expected = topk_reference(scores, visible, topk)

    assert selected.dtype == torch.bool and selected.shape == visible.shape
    assert torch.equal(selected, expected)
    assert not (selected & ~visible).any(), "selected an invisible key"
    assert torch.equal(selected.sum(-1), visible.sum(-1).clamp_max(topk))
    # the cases must exercise what they claim: rows both below and above the budget
    counts = visible.sum(-1)
    assert (counts > topk).any() or topk >= keys
    assert (counts < topk).any() or topk == 1


def test_ties_prefer_lower_positions():
    """All visible scores equal: the selection is exactly the first ``topk`` visible positions."""
    visible = torch.zeros(1, 1, 10, dtype=torch.bool)
    visible[0, 0, [1, 3, 4, 7, 9]] = True
    scores = torch.zeros(1, 1, 10)
    scores[0, 0, 0] = 100.0  # invisible high score must be ignored
    scores[0, 0, 9] = 1.0  # the single best visible key
    selected = indexer_topk(scores, visible, 3)
    assert selected[0, 0].nonzero().flatten().tolist() == [1, 3, 9]


def test_invisible_keys_never_selected_even_with_best_scores():
    torch.manual_seed(3)
    batch, queries, keys = 2, 8, 20
    visible = causal_visible(batch, queries, keys)
    scores = torch.randn(batch, queries, keys)
    scores = scores.masked_fill(~visible, 1e9)  # the future looks best
    selected = indexer_topk(scores, visible, 16)
    assert not (selected & ~visible).any()
    assert torch.equal(selected.sum(-1), visible.sum(-1).clamp_max(16))
