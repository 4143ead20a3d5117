"""The pretraining loss path (default numerics through ``TrainingCache``) against the invariant trainer
forward's log-probs, the batched window kernels against the per-sequence reference backends, and the
distillation loss."""

import pytest
import torch

from services.engine.checkpoint.loader import load_model
from services.engine.model.step_metadata import SequenceStep, build_step_metadata
from tests.conftest import TEST_DEVICE, relative_error
from trainer import PackedBatch, Trajectory, make_trainable, trajectory_logprobs
from trainer.window_kernels import WINDOW_KERNELS, use_window_kernels, window_shape
from trainer.window_loss import distillation_loss, language_model_loss, window_logits

# Two windows longer than the tiny preset's index_topk (16), so the DSA selection is active.
WINDOWS = torch.tensor([list(range(40, 80)), list(range(300, 340))])


def test_window_loss_is_the_invariant_paths_mean_logprob(tiny_checkpoint):
    checkpoint = tiny_checkpoint("k3")
    model = load_model(checkpoint, device=TEST_DEVICE, dtype=torch.float32).requires_grad_(True)
    loss = language_model_loss(model, WINDOWS.to(TEST_DEVICE))
    invariant = make_trainable(load_model(checkpoint, device=TEST_DEVICE, dtype=torch.float32))
    batch = PackedBatch.pack([Trajectory(tuple(row), ()) for row in WINDOWS.tolist()])
    result = trajectory_logprobs(invariant, batch, include_prompt=True)
    assert int(result.scored.sum()) == WINDOWS.numel() - WINDOWS.shape[0]  # every position but each first
    want = -result.logprobs[result.scored].mean()
    assert relative_error(loss.detach(), want.detach()) < 1e-5
    loss.backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().max() > 0


def test_distillation_loss_is_zero_only_at_the_target(tiny_checkpoint):
    model = load_model(tiny_checkpoint("k3"), device=TEST_DEVICE, dtype=torch.float32)
    logits = window_logits(model, WINDOWS.to(TEST_DEVICE))
    assert logits.shape == (WINDOWS.shape[0] * (WINDOWS.shape[1] - 1), model.config.vocab_size)
    assert float(distillation_loss(logits, logits)) < 1e-6
    draft = logits.clone().requires_grad_(True)
    shifted = distillation_loss(draft, logits + torch.randn_like(logits))
    assert float(shifted.detach()) > 1e-2
    shifted.backward()
    assert draft.grad.abs().max() > 0


def test_refuses_the_invariant_numerics(tiny_checkpoint):
    model = make_trainable(load_model(tiny_checkpoint("k3"), device=TEST_DEVICE, dtype=torch.float32))
    with pytest.raises(ValueError, match="set_batch_invariant"):
        window_logits(model, WINDOWS)


def test_window_kernels_match_the_per_sequence_reference(tiny_checkpoint):
    """Three windows of 80 tokens: two KDA chunks each, the DSA selection active (top 16)."""
    windows = torch.stack([torch.arange(80) + 40 * i for i in range(3)]).to(TEST_DEVICE)
    models = []
    for batched in (False, True):
        model = load_model(tiny_checkpoint("k3"), device=TEST_DEVICE, dtype=torch.float32).requires_grad_(
            True
        )
        models.append(use_window_kernels(model) if batched else model)
    losses = [language_model_loss(model, windows) for model in models]
    assert models[1].kernels.name == WINDOW_KERNELS and models[0].kernels.name == "reference"
    assert relative_error(losses[1].detach(), losses[0].detach()) < 1e-6
    for loss in losses:
        loss.backward()
    compared = 0
    for (name, reference), (_, batched) in zip(
        models[0].named_parameters(), models[1].named_parameters(), strict=True
    ):
        if reference.grad is None:
            assert batched.grad is None, name
            continue
        assert relative_error(batched.grad, reference.grad) < 1e-5, name
        compared += "self_attn" in name
    assert compared > 10  # KDA and MLA parameters got gradients through both paths


def test_window_kernels_refuse_other_steps():
    ragged = [SequenceStep((5, 6, 7), 0, (0,), 0), SequenceStep((8, 9), 0, (1,), 1)]
    with pytest.raises(ValueError, match="one length"):
        window_shape(build_step_metadata(ragged, 4, "cpu"))
    continued = [SequenceStep((5, 6), 2, (0,), 0)]
    with pytest.raises(ValueError, match="fresh sequences"):
        window_shape(build_step_metadata(continued, 4, "cpu"))
