"""The distributed DSA top-k on 4 gloo ranks (DCP 4, and DCP 2 on two sub-groups) equals the single-rank
top-k exactly: same positions, same order, ties by position, -1 padding when fewer keys than k.

Every rank builds the whole score matrix from a shared seed and keeps its own columns (token ``p`` on
rank ``p % D``); the single-rank answer is ``topk_by_score`` over the whole matrix.
"""

import pytest
import torch
import torch.distributed as dist

from kernels.dsa.paged_naive import topk_by_score
from services.engine.parallel.dcp_shard import DcpShard
from services.engine.parallel.distributed_topk import ExchangeStats, default_candidates, distributed_topk
from tests.parallel.gloo_ranks import run_ranks

WORLD = 4


def _scores(case: str) -> tuple[torch.Tensor, int, int | None]:
    """``(scores [T, W], topk, candidates)`` of a case, the same on every rank."""
    gen = torch.Generator().manual_seed(len(case))
    if case == "random":
        return torch.randn(6, 200, generator=gen), 32, None
    if case == "ties_k_over_share":  # 3 distinct values: most of the top-k are ties broken by position
        scores = torch.randint(0, 3, (6, 120), generator=gen).float()
        return scores, 90, None
    if case == "fewer_keys_than_k":  # causal rows: row t sees positions <= 3 t (some see fewer than k)
        scores = torch.randn(5, 40, generator=gen)
        visible = torch.arange(40)[None, :] <= 3 * torch.arange(5)[:, None]
        return scores.masked_fill(~visible, float("-inf")), 16, None
    if case == "all_best_on_one_rank":  # the best keys tie, all at multiples of 4 (rank 0 at dcp 4 and 2)
        scores = torch.randn(4, 160, generator=gen)
        scores[:, ::4] = 100.0
        return scores, 40, None
    if case == "equal_everywhere_one_round":  # every score equal, candidates = k: never refilled
        return torch.zeros(3, 50), 20, 20
    raise AssertionError(case)


CASES = (
    "random",
    "ties_k_over_share",
    "fewer_keys_than_k",
    "all_best_on_one_rank",
    "equal_everywhere_one_round",
)


def _rank_body(rank: int, size: int) -> dict:
    pairs = dist.new_group([0, 1]), dist.new_group([2, 3])  # every rank creates both, in the same order
    layouts = {4: (DcpShard(rank, 4), dist.group.WORLD), 2: (DcpShard(rank % 2, 2), pairs[rank // 2])}
    results = {}
    for dcp, (shard, group) in layouts.items():
        for case in CASES:
            scores, topk, candidates = _scores(case)
            stats = ExchangeStats()
            mine = scores[:, shard.rank :: dcp]
            got = distributed_topk(mine, shard, group, topk, candidates, stats)
            results[(dcp, case)] = (got, stats)
    return results


@pytest.fixture(scope="module")
def rank_results():
    return run_ranks(_rank_body, WORLD)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dcp", [2, 4], ids=lambda d: f"dcp{d}")
def test_distributed_topk_equals_single_rank(rank_results, dcp, case):
    scores, topk, _ = _scores(case)
    want = topk_by_score(scores, topk)
    for rank, results in enumerate(rank_results):
        got, stats = results[(dcp, case)]
        assert torch.equal(got, want), f"rank {rank}: {got.tolist()} != {want.tolist()}"
        assert stats.calls == 1 and stats.rounds == 1 + stats.refills
    if case == "fewer_keys_than_k":
        assert (want == -1).any(), "the case must have rows with fewer keys than k"


def test_refill_triggers_only_when_a_rank_holds_more_qualifying_keys(rank_results):
    refills = {key: stats.refills for key, (_, stats) in rank_results[0].items()}
    print("refills per (dcp, case):", refills)
    assert refills[(4, "all_best_on_one_rank")] == 1 and refills[(2, "all_best_on_one_rank")] == 1
    assert refills[(4, "equal_everywhere_one_round")] == 0
    assert refills[(4, "random")] == 0, "four standard deviations of slack should suffice for random scores"
    got = rank_results[0][(4, "all_best_on_one_rank")][1]
    sent = default_candidates(40, 4)
    # round 1: [4, 2c + 1] int32; round 2: [refilled rows, 2k + 1] int32
    assert got.bytes_sent == 4 * 4 * (2 * sent + 1) + got.refilled_rows * 4 * (2 * 40 + 1)
