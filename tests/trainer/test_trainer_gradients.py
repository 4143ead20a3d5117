"""The trainer's gradients against a float32 reference: the same loss (sum of log-probs) through the
default ``reference`` numerics (library kernels, expanded MLA, chunked KDA), parameter by parameter.

Every parameter that should learn gets a finite gradient within ``GRAD_RTOL`` of the reference's:
routed experts, the shared expert, the router, KDA (projections, conv, gate, ``A_log``, ``dt_bias``,
output norm), MLA projections, embeddings, LM head, norms. The DSA indexer and the router's
selection bias only choose (top-k) and get none, on both sides (``trainer/trainer_forward.py``)."""

import pytest
import torch

from services.engine.checkpoint.loader import load_model
from tests.conftest import FAMILIES, TEST_DEVICE, relative_error
from trainer import PackedBatch, Trajectory, make_trainable, trajectory_logprobs

GRAD_RTOL = 1e-3  # measured worst case 1.2e-5 (kimi_linear's KDA), float32 both sides
TRAJECTORIES = [
    Trajectory(tuple(range(30, 30 + 30)), tuple(range(700, 712))),
    Trajectory(tuple(range(200, 209)), tuple(range(600, 621))),
]
NO_GRADIENT = ("indexer.", "e_score_correction_bias")
MUST_LEARN = {
    "routed experts": ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"),
    "shared expert": ("mlp.shared_experts.gate_proj", "mlp.shared_experts.down_proj"),
    "router": ("mlp.gate.weight",),
    "MLA": ("kv_a_proj_with_mqa", "kv_b_proj", "self_attn.o_proj"),
    "embeddings and head": ("embed_tokens", "lm_head"),
}
KDA = ("forget_gate.A_log", "forget_gate.dt_bias", "conv1d", "b_proj", "g_b_proj", "o_norm")


def reference_loss(model, trajectories) -> torch.Tensor:
    """Sum over trajectories of every token's log-prob after the first, full-sequence forward."""
    total = 0.0
    for trajectory in trajectories:
        ids = torch.tensor([trajectory.token_ids], device=TEST_DEVICE)
        logprobs = torch.log_softmax(model(ids)[0, :-1].float(), dim=-1)
        total = total + logprobs.gather(-1, ids[0, 1:, None]).sum()
    return total


def gradients(model, loss) -> dict[str, torch.Tensor | None]:
    names, params = zip(*model.named_parameters(), strict=True)
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return dict(zip(names, grads, strict=True))


@pytest.mark.parametrize("family", FAMILIES)
def test_gradients_match_the_float32_reference(family, tiny_checkpoint):
    checkpoint = tiny_checkpoint(family)
    trained = make_trainable(load_model(checkpoint, device=TEST_DEVICE, dtype=torch.float32))
    result = trajectory_logprobs(trained, PackedBatch.pack(TRAJECTORIES), include_prompt=True)
    loss = result.logprobs[result.scored].sum()
    reference = load_model(checkpoint, device=TEST_DEVICE, dtype=torch.float32).requires_grad_(True)
    want_loss = reference_loss(reference, TRAJECTORIES)
    assert int(result.scored.sum()) == sum(len(t) - 1 for t in TRAJECTORIES)
    assert relative_error(loss.detach(), want_loss.detach()) < 1e-5
    got, want = gradients(trained, loss), gradients(reference, want_loss)
    learned = []
    for name, grad in got.items():
        if any(part in name for part in NO_GRADIENT):
            assert grad is None and want[name] is None, f"{name}: a selection-only parameter got a gradient"
            continue
        assert grad is not None and want[name] is not None, f"{name}: no gradient"
        assert torch.isfinite(grad).all(), f"{name}: non-finite gradient"
        assert want[name].abs().max() > 0, f"{name}: the reference gradient is zero (nothing compared)"
        assert relative_error(grad, want[name]) < GRAD_RTOL, name
        learned.append(name)
    groups = dict(MUST_LEARN, **({"KDA": KDA} if trained.config.kda is not None else {}))
    for group, parts in groups.items():
        for part in parts:
            assert any(part in name for name in learned), f"{group}: no learned parameter matches {part}"


def test_refuses_the_default_numerics(tiny_checkpoint):
    model = load_model(tiny_checkpoint("k3"), device=TEST_DEVICE, dtype=torch.float32)
    with pytest.raises(ValueError, match="batch-invariant"):
        trajectory_logprobs(model, PackedBatch.pack(TRAJECTORIES))


def test_nothing_generated_scores_nothing(tiny_checkpoint):
    model = make_trainable(
        load_model(tiny_checkpoint("kimi_linear"), device=TEST_DEVICE, dtype=torch.float32)
    )
    result = trajectory_logprobs(model, PackedBatch.pack([Trajectory((5, 6, 7), ())]))
    assert not result.scored.any() and not result.generated.any()
    assert result.of_generated(0).numel() == 0 and torch.equal(result.logprobs, torch.zeros(3))
