"""MoE load balancing in pretraining: each router's selection bias moves one ``rate`` against its experts'
load after a step, from training forwards only."""

import torch

from services.engine.checkpoint.loader import load_model
from services.engine.model.moe import Router
from tests.conftest import TEST_DEVICE
from trainer.expert_balance import ExpertBalance
from trainer.window_loss import language_model_loss

RATE = 1e-3


def test_bias_moves_against_the_load(tiny_checkpoint):
    model = load_model(tiny_checkpoint("k3"), device=TEST_DEVICE, dtype=torch.float32).requires_grad_(True)
    balance = ExpertBalance(model, RATE)
    windows = torch.stack([torch.arange(40) + 50 * i for i in range(3)]).to(TEST_DEVICE)
    with torch.no_grad():
        language_model_loss(model, windows)  # an evaluation: not counted
    assert not balance.counts
    before = [router.e_score_correction_bias.detach().clone() for router in balance.routers]
    language_model_loss(model, windows).backward()
    counts = {index: counted.clone() for index, counted in balance.counts.items()}
    balance.step()
    assert len(balance.routers) == sum(isinstance(m, Router) for m in model.modules()) and len(counts) > 0
    moved = 0
    for index, router in enumerate(balance.routers):
        load = counts[index].float()
        tokens_routed = windows.numel() * router.spec.num_experts_per_tok
        assert int(load.sum()) == tokens_routed
        want = before[index] - RATE * torch.sign(load - load.mean())
        assert torch.equal(router.e_score_correction_bias.detach(), want)
        moved += int((want != before[index]).sum())
    assert moved > 0 and not balance.counts
