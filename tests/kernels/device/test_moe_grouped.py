"""Grouped-GEMM MoE (Triton and torch._grouped_mm) against the reference: ragged routing with empty
experts, one token, shared experts fused as extra experts, and the device-side alignment."""

from __future__ import annotations

import pytest
import torch

from kernels.moe import grouped, grouped_mm, naive
from tests.kernels.kernel_testing import assert_rel

E, TOP_K, D, I = 8, 2, 32, 16
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
IMPLS = {"triton": grouped.moe_grouped, "grouped_mm": grouped_mm.moe_grouped}


def _routing(tokens: int, seed: int, skip=(2, 5)):
    """Distinct experts per token drawn from those not in ``skip`` (so some experts stay empty)."""
    g = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([e for e in range(E) if e not in skip])
    pick = torch.rand(tokens, allowed.numel(), generator=g).argsort(dim=1)[:, :TOP_K]
    weights = torch.rand(tokens, TOP_K, generator=g)
    return allowed[pick], weights


def _weights(dtype, device, seed=1, experts=E):
    g = torch.Generator().manual_seed(seed)
    w_gate_up = (torch.randn(experts, 2 * I, D, generator=g) * D**-0.5).to(dtype).to(device)
    w_down = (torch.randn(experts, D, I, generator=g) * I**-0.5).to(dtype).to(device)
    return w_gate_up, w_down


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tokens", [1, 7, 40], ids=["N1", "N7", "N40"])
@pytest.mark.parametrize("impl", IMPLS, ids=list(IMPLS))
def test_moe_grouped_matches_reference(impl, tokens, dtype, device):
    if impl == "grouped_mm" and device == "cuda" and dtype == torch.float32:
        pytest.skip("torch._grouped_mm on CUDA is bf16 only")
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, D, generator=g).to(dtype).to(device)
    expert_ids, weights = _routing(tokens, seed=tokens)
    expert_ids, weights = expert_ids.to(device), weights.to(device)
    w_gate_up, w_down = _weights(dtype, device)
    out = IMPLS[impl](x, expert_ids, weights, w_gate_up, w_down)
    want = naive.moe_grouped(
        x.double().cpu(),
        expert_ids.cpu(),
        weights.double().cpu(),
        w_gate_up.double().cpu(),
        w_down.double().cpu(),
    )
    assert out.dtype == dtype and out.shape == (tokens, D)
    assert_rel(out.double().cpu(), want, TOL[dtype], "out")


@pytest.mark.parametrize("impl", IMPLS, ids=list(IMPLS))
def test_shared_experts_fused_equal_a_separate_mlp(impl, device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    tokens, shared_width = 9, 2 * I
    g = torch.Generator().manual_seed(7)
    x = torch.randn(tokens, D, generator=g)
    gate, up = (
        torch.randn(shared_width, D, generator=g) * 0.2,
        torch.randn(shared_width, D, generator=g) * 0.2,
    )
    down = torch.randn(D, shared_width, generator=g) * 0.2
    expert_ids, weights = _routing(tokens, seed=3)
    w_gate_up, w_down = _weights(torch.float32, "cpu")
    want = naive.moe_grouped(x, expert_ids, weights, w_gate_up, w_down)
    want = want + torch.nn.functional.silu(x @ gate.T) * (x @ up.T) @ down.T

    all_gate_up, all_down = naive.stack_shared_experts(w_gate_up, w_down, gate, up, down)
    ids, all_weights = naive.with_shared_experts(expert_ids, weights, E, shared_width // I)
    assert ids.shape == (tokens, TOP_K + 2)
    args = (x, ids, all_weights, all_gate_up, all_down)
    out = IMPLS[impl](
        *(t.to(device) if t.is_floating_point() is False else t.to(dtype).to(device) for t in args)
    )
    assert_rel(out.float().cpu(), want, TOL[dtype], "out")


def test_moe_align_sorts_pads_and_labels_blocks(device):
    expert_ids = torch.tensor([[3, 0], [0, 3], [7, 0]], device=device)
    sorted_pairs, block_experts, counts = grouped.moe_align(expert_ids, 8, 4)
    pad = 6  # N * k
    assert counts.tolist() == [3, 0, 0, 2, 0, 0, 0, 1]
    capacity = sorted_pairs.shape[0]
    assert capacity == -(-(6 + 8 * 3) // 4) * 4
    want = [1, 2, 5, pad, 0, 3, pad, pad, 4, pad, pad, pad] + [pad] * (capacity - 12)
    assert sorted_pairs.tolist() == want
    assert block_experts.tolist() == [0, 3, 7] + [-1] * (capacity // 4 - 3)
