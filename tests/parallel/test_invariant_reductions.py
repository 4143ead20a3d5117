"""The single-rank forms of the parallel reductions give the bits the one-process code gives."""

import pytest
import torch

from kernels.invariant import fixed_linear, tree_sum
from kernels.moe.naive import moe_experts
from services.engine.model.invariant_numerics import InvariantNumerics
from services.engine.model.numerics import Numerics
from services.engine.parallel.collectives import sum_segments
from services.engine.parallel.context import ParallelContext
from services.engine.parallel.expert_parallel import combine_in_expert_order, expert_slot_outputs
from services.engine.parallel.layout import INVARIANT_K_SEGMENTS
from services.engine.parallel.row_parallel import row_parallel_linear


def test_fixed_linear_columns_keep_their_bits_in_any_slice():
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(19, 64, generator=generator), torch.randn(48, 64, generator=generator)
    whole = fixed_linear(x, weight)
    for start, width in ((0, 1), (3, 8), (8, 17), (5, 23), (16, 32)):
        piece = fixed_linear(x, weight[start : start + width])
        assert torch.equal(piece, whole[:, start : start + width]), (start, width)


def test_invariant_row_parallel_product_is_a_tree_over_fixed_segments():
    generator = torch.Generator().manual_seed(1)
    x, weight = torch.randn(5, 64, generator=generator), torch.randn(24, 64, generator=generator)
    nx = InvariantNumerics()
    got = row_parallel_linear(x, weight, nx, ParallelContext.single())
    parts = zip(x.chunk(INVARIANT_K_SEGMENTS, -1), weight.chunk(INVARIANT_K_SEGMENTS, -1), strict=True)
    partials = torch.stack([fixed_linear(xs, ws) for xs, ws in parts])
    assert torch.equal(nx.segment_products(x, weight, INVARIANT_K_SEGMENTS), partials)
    assert torch.equal(got, tree_sum(partials, 0))
    # a TP 2 rank's call gives its half's bits
    half = nx.segment_products(x[:, 32:], weight[:, 32:], INVARIANT_K_SEGMENTS // 2)
    assert torch.equal(half, partials[4:])
    want = tree_sum(partials, 0)
    assert torch.equal(sum_segments(torch.stack([want, -want]), None), torch.zeros_like(want))
    assert torch.equal(row_parallel_linear(x, weight, Numerics(), ParallelContext.single()), x @ weight.T)
    with pytest.raises(ValueError, match="width 60 is not a multiple of 8 segments"):
        row_parallel_linear(x[:, :60], weight[:, :60], nx, ParallelContext.single())


@pytest.mark.parametrize("numerics", [Numerics(), InvariantNumerics()], ids=["default", "invariant"])
def test_per_slot_outputs_combined_in_expert_order_are_moe_experts(numerics):
    generator = torch.Generator().manual_seed(2)
    tokens, experts, k, hidden, inter = 11, 8, 3, 16, 8
    x = torch.randn(tokens, hidden, generator=generator)
    ids = torch.stack([torch.randperm(experts, generator=generator)[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, k, generator=generator)
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=generator)
    down = torch.randn(experts, hidden, inter, generator=generator)
    want = numerics.moe_experts(x, ids, weights, gate_up, down)
    if not numerics.batch_invariant:
        assert torch.equal(want, moe_experts(x, ids, weights, gate_up, down))
    # EP 2's halves: each rank's slots, the owner's value picked per slot (here: their sum, one is 0)
    halves = [
        expert_slot_outputs(
            x,
            ids - 4 * rank,
            weights,
            gate_up[4 * rank : 4 * rank + 4],
            down[4 * rank : 4 * rank + 4],
            numerics,
        )
        for rank in range(2)
    ]
    assert all((half == 0).all(-1).any() for half in halves)  # each rank computed only part of the slots
    owner = (ids // 4)[..., None].expand_as(halves[0])
    picked = torch.where(owner == 0, halves[0], halves[1])
    assert torch.equal(combine_in_expert_order(picked, ids), want)
