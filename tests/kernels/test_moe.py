"""MoE references: the group-limited sigmoid router and the SwiGLU experts vs transformers and loops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.kimi_linear import modeling_kimi_linear as hf_kimi

from kernels.moe.naive import moe_experts, route_tokens
from tests.kernels.kernel_testing import assert_rel, rel_err

HIDDEN, INTER = 32, 16
ROUTER_CASES = {  # name: (experts, top_k, n_group, topk_group, norm_topk_prob, routed_scaling_factor)
    "E8_k2_flat": (8, 2, 1, 1, True, 1.0),
    "E16_k4_g4_keep2": (16, 4, 4, 2, True, 2.446),
    "E64_k6_g8_keep3_nonorm": (64, 6, 8, 3, False, 2.5),
    "E32_k8_g8_keep4": (32, 8, 8, 4, True, 1.0),
}


def hf_config(experts: int, top_k: int, n_group: int, topk_group: int, norm: bool, scaling: float):
    return hf_kimi.KimiLinearConfig(
        hidden_size=HIDDEN,
        moe_intermediate_size=INTER,
        num_local_experts=experts,
        num_experts_per_tok=top_k,
        n_group=n_group,
        topk_group=topk_group,
        norm_topk_prob=norm,
        routed_scaling_factor=scaling,
    )


def sort_by_expert(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ids_sorted, order = ids.sort(dim=-1)
    return weights.gather(-1, order), ids_sorted


@pytest.mark.parametrize("case", list(ROUTER_CASES.values()), ids=list(ROUTER_CASES))
def test_router_matches_transformers(case):
    torch.manual_seed(0)
    experts, top_k, n_group, topk_group, norm, scaling = case
    router = hf_kimi.KimiLinearTopkRouter(hf_config(*case))
    with torch.no_grad():
        router.weight.copy_(torch.randn(experts, HIDDEN) * HIDDEN**-0.5)
        router.e_score_correction_bias.copy_(0.1 * torch.randn(experts))
    x = torch.randn(2, 13, HIDDEN)

    with torch.no_grad():
        logits, hf_weights, hf_ids = router(x)
    bias = router.e_score_correction_bias
    weights, ids = route_tokens(logits.sigmoid(), bias, top_k, n_group, topk_group, norm, scaling)

    assert weights.shape == ids.shape == (26, top_k) and ids.dtype == torch.int64
    weights, ids = sort_by_expert(weights, ids)
    hf_weights, hf_ids = sort_by_expert(hf_weights, hf_ids)
    assert torch.equal(ids, hf_ids), "same expert set per token"
    assert_rel(weights, hf_weights, 1e-6, "weights")
    if norm:
        assert torch.allclose(weights.sum(-1), torch.full((26,), scaling), rtol=1e-6)
    if topk_group < n_group:  # chosen experts come from at most topk_group groups
        groups_used = torch.stack([(ids // (experts // n_group) == g).any(-1) for g in range(n_group)], -1)
        assert (groups_used.sum(-1) <= topk_group).all()


def test_group_limit_excludes_the_best_expert():
    """Expert 0 has the best score, but its group (best two summed) loses to groups 1 and 2."""
    probs = torch.tensor([[0.99, 0.01, 0.62, 0.60, 0.58, 0.56, 0.30, 0.31]])
    args = dict(top_k=2, n_group=4, topk_group=2, norm_topk_prob=False, routed_scaling_factor=1.0)
    weights, ids = route_tokens(probs, torch.zeros(8), **args)
    weights, ids = sort_by_expert(weights, ids)
    assert ids.tolist() == [[2, 3]]
    assert_rel(weights, probs[:, [2, 3]], 1e-6, "weights")
    # without group limiting the best expert would have been picked
    _, flat_ids = route_tokens(probs, torch.zeros(8), **{**args, "n_group": 1, "topk_group": 1})
    assert 0 in flat_ids.tolist()[0]


def test_bias_chooses_but_does_not_weigh():
    """The correction bias flips the choice, while the weights stay the unbiased sigmoid scores."""
    probs = torch.tensor([[0.9, 0.8, 0.2, 0.1]])
    bias = torch.tensor([0.0, 0.0, 1.0, 0.0])
    weights, ids = route_tokens(probs, bias, 2, 1, 1, False, 2.0)
    weights, ids = sort_by_expert(weights, ids)
    assert ids.tolist() == [[0, 2]]
    assert_rel(weights, 2.0 * probs[:, [0, 2]], 1e-6, "weights")
    weights, _ = route_tokens(probs, bias, 2, 1, 1, True, 2.0)
    assert_rel(weights.sort(-1).values, 2.0 * torch.tensor([[0.2, 0.9]]) / 1.1, 1e-6, "normalised weights")


def make_experts(experts: int, dtype: torch.dtype = torch.float32):
    w_gate_up = (torch.randn(experts, 2 * INTER, HIDDEN) * HIDDEN**-0.5).to(dtype)
    w_down = (torch.randn(experts, HIDDEN, INTER) * INTER**-0.5).to(dtype)
    return w_gate_up, w_down


def random_routing(tokens: int, experts: int, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.rand(tokens, experts).argsort(-1)[:, :top_k]
    return torch.rand(tokens, top_k), ids


def experts_loop(x, ids, weights, w_gate_up, w_down) -> torch.Tensor:
    """One token, one chosen expert at a time, in float64."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for n in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[n, j])
            gate, up = (w_gate_up[e].double() @ x[n].double()).chunk(2)
            out[n] += float(weights[n, j]) * (w_down[e].double() @ (F.silu(gate) * up))
    return out


EXPERT_CASES = {  # name: (experts, top_k, tokens)
    "E8_k2_N1": (8, 2, 1),
    "E8_k2_N19": (8, 2, 19),
    "E16_k4_N40": (16, 4, 40),
    "E6_k6_N5_all": (6, 6, 5),
}


@pytest.mark.parametrize("case", list(EXPERT_CASES.values()), ids=list(EXPERT_CASES))
def test_experts_match_loop_and_transformers(case):
    torch.manual_seed(1)
    experts, top_k, tokens = case
    w_gate_up, w_down = make_experts(experts)
    weights, ids = random_routing(tokens, experts, top_k)
    x = torch.randn(tokens, HIDDEN)

    out = moe_experts(x, ids, weights, w_gate_up, w_down)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert_rel(out, experts_loop(x, ids, weights, w_gate_up, w_down), 1e-5, "vs loop")

    module = hf_kimi.KimiLinearExperts(hf_config(experts, top_k, 1, 1, True, 1.0))
    with torch.no_grad():
        module.gate_up_proj.copy_(w_gate_up)
        module.down_proj.copy_(w_down)
        expected = module(x, ids, weights)
    assert_rel(out, expected, 1e-6, "vs transformers")


def test_unused_experts_are_never_read():
    torch.manual_seed(2)
    w_gate_up, w_down = make_experts(8)
    weights, ids = random_routing(10, 4, 2)  # only experts 0..3 are chosen
    w_gate_up[4:], w_down[4:] = float("nan"), float("nan")
    out = moe_experts(torch.randn(10, HIDDEN), ids, weights, w_gate_up, w_down)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rows_do_not_depend_on_batch_composition(dtype):
    torch.manual_seed(3)
    experts, top_k, tokens = 16, 4, 24
    w_gate_up, w_down = make_experts(experts, dtype)
    weights, ids = random_routing(tokens, experts, top_k)
    x = torch.randn(tokens, HIDDEN).to(dtype)
    out = moe_experts(x, ids, weights, w_gate_up, w_down)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    for i in (0, 7, 23):
        alone = moe_experts(x[i : i + 1], ids[i : i + 1], weights[i : i + 1], w_gate_up, w_down)
        assert rel_err(out[i : i + 1], alone) <= tol, f"row {i}"
    # a different batch around the same row
    perm = torch.randperm(tokens)
    shuffled = moe_experts(x[perm], ids[perm], weights[perm], w_gate_up, w_down)
    assert rel_err(shuffled, out[perm]) <= tol


def test_route_then_combine_matches_transformers_moe_path():
    """Router output fed into the experts, as ``KimiLinearMoE`` does (without its shared expert)."""
    torch.manual_seed(4)
    case = ROUTER_CASES["E16_k4_g4_keep2"]
    config = hf_config(*case)
    router, module = hf_kimi.KimiLinearTopkRouter(config), hf_kimi.KimiLinearExperts(config)
    w_gate_up, w_down = make_experts(16)
    with torch.no_grad():
        router.weight.copy_(torch.randn(16, HIDDEN) * HIDDEN**-0.5)
        router.e_score_correction_bias.copy_(0.1 * torch.randn(16))
        module.gate_up_proj.copy_(w_gate_up)
        module.down_proj.copy_(w_down)
        x = torch.randn(11, HIDDEN)
        logits, hf_weights, hf_ids = router(x)
        expected = module(x, hf_ids, hf_weights)
    weights, ids = route_tokens(logits.sigmoid(), router.e_score_correction_bias, *case[1:])
    assert_rel(moe_experts(x, ids, weights, w_gate_up, w_down), expected, 1e-6, "moe output")
