"""RL-shaped end to end, without adapters: the engine samples trajectories in batch-invariant mode, the
trainer recomputes their log-probs (bitwise the served ones), one policy-gradient SGD step on the
trainer's loss moves the *served* log-probs of the same tokens as the trainer's gradient predicts to
first order, and the trainer again matches the new served bits.

Engine and trainer share one module (``LLM(prebuilt=model)``), so the step is visible to the next
generation at once. Prefix caching is off: cached blocks hold the old weights' latents and state.
"""

import torch

from services.engine import LLM, SamplingParams
from services.engine.checkpoint.loader import load_model
from tests.conftest import TEST_DEVICE
from trainer import PackedBatch, make_trainable, trajectory_logprobs

from .served import assert_same_bits, assert_served_invariant, trajectories

PROMPTS = [list(range(30, 30 + 37)), list(range(200, 212)), list(range(400, 420))]
PARAMS = SamplingParams(max_tokens=8, temperature=1.0, seed=5, logprobs=0, ignore_eos=True)
ADVANTAGES = (1.0, -1.0, 0.5)
# The step's size: the predicted first-order rise of the objective. Small, because first order holds only
# while every discrete choice (MoE experts, DSA top-k) stays put: on this checkpoint a 10x larger step
# flips one and the objective jumps by 1.07 instead of 0.05; float32 noise on it is about 1e-5.
OBJECTIVE_RISE = 0.005


def serve(llm: LLM):
    outputs = llm.generate(PROMPTS, PARAMS)
    assert_served_invariant(llm)
    assert not llm.engine.has_unfinished
    llm.engine.check_integrity()
    return outputs


def test_one_policy_gradient_step_moves_the_served_logprobs_as_predicted(tiny_checkpoint):
    checkpoint = tiny_checkpoint("k3")
    model = make_trainable(load_model(checkpoint, device=TEST_DEVICE, dtype=torch.float32))
    llm = LLM(
        str(checkpoint),
        device=TEST_DEVICE,
        batch_invariant=True,
        prebuilt=model,
        enable_prefix_caching=False,
        max_num_batched_tokens=32,
    )
    before = serve(llm)
    order = [0, 1, 2]
    result = trajectory_logprobs(model, PackedBatch.pack(trajectories(before)))
    assert assert_same_bits(result, before, order) == 3 * PARAMS.max_tokens

    # Objective J = sum_i A_i * (sum of trajectory i's generated log-probs); one SGD ascent step on J.
    params = [p for p in model.parameters() if p.requires_grad]
    per_trajectory = []
    for index in range(len(before)):
        grads = torch.autograd.grad(
            result.of_generated(index).sum(), params, retain_graph=True, allow_unused=True
        )
        per_trajectory.append(
            [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]
        )
    direction = [
        sum(a * g[k] for a, g in zip(ADVANTAGES, per_trajectory, strict=True)) for k in range(len(params))
    ]
    norm2 = sum(float((d.double() ** 2).sum()) for d in direction)
    lr = OBJECTIVE_RISE / norm2
    predicted = [
        lr * sum(float((g.double() * d.double()).sum()) for g, d in zip(grads, direction, strict=True))
        for grads in per_trajectory
    ]
    with torch.no_grad():
        for param, step in zip(params, direction, strict=True):
            param.add_(lr * step)

    after = serve(llm)
    for old, new in zip(before, after, strict=True):
        assert new.token_ids == old.token_ids, "the step changed a sampled token: too large for first order"
    served = [sum(new.logprobs) - sum(old.logprobs) for old, new in zip(before, after, strict=True)]
    objective = sum(a * s for a, s in zip(ADVANTAGES, served, strict=True))
    assert abs(objective - OBJECTIVE_RISE) < 0.2 * OBJECTIVE_RISE, (objective, OBJECTIVE_RISE)
    scale = max(abs(p) for p in predicted)
    for index, (want, got) in enumerate(zip(predicted, served, strict=True)):
        assert abs(got - want) < 0.2 * scale, (
            f"trajectory {index}: served moved {got:.4g}, predicted {want:.4g}"
        )
    assert served[0] > 0, "the positive-advantage trajectory's served log-probs should rise"

    # The updated weights: the trainer still reproduces what the engine now serves, bit for bit.
    with torch.no_grad():
        again = trajectory_logprobs(model, PackedBatch.pack(trajectories(after)))
    assert assert_same_bits(again, after, order) == 3 * PARAMS.max_tokens
