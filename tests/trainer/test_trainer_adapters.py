"""The trainer with LoRA adapters: trajectories served under several adapters and the base model in one
batch-invariant batch are recomputed bit for bit (float32 patterns), each with its own adapter; the
adapters' A/B get finite gradients within ``GRAD_RTOL`` of the float32 reference (the default numerics'
full-sequence forward with the same adapter, and autograd); the adapter written back reloads exactly."""

import pytest
import torch

from services.engine import LLM, SamplingParams
from services.engine.adapters.lora_adapter import load_lora_adapter
from services.engine.checkpoint.loader import load_model
from tests.conftest import TEST_DEVICE, relative_error
from tests.lora_adapters import random_pairs, write_peft_adapter
from trainer import (
    PackedBatch,
    Trajectory,
    make_trainable,
    save_adapter,
    trainable_adapter,
    trajectory_logprobs,
)

from .served import assert_same_bits, assert_served_invariant, float32_bits

RANK, ALPHA = 4, 8.0
PROMPTS = [list(range(30, 30 + 37)), list(range(200, 205)), list(range(400, 420)), list(range(90, 101))]
ADAPTERS = ["alpha", "", "beta", "alpha"]  # two adapters and a base row in one served batch
SAMPLED = SamplingParams(max_tokens=6, temperature=0.9, top_p=0.95, seed=11, logprobs=0, ignore_eos=True)
GRAD_RTOL = 1e-3


@pytest.fixture(scope="module")
def folders(tiny_checkpoint, tmp_path_factory):
    model_dir = tiny_checkpoint("k3")
    made = {}
    for seed, name in ((1, "alpha"), (2, "beta")):
        pairs = random_pairs(model_dir, RANK, seed=seed)
        made[name] = write_peft_adapter(tmp_path_factory.mktemp(f"k3-{name}"), pairs, RANK, ALPHA)
    return model_dir, made


def trainer_model(model_dir):
    return make_trainable(load_model(model_dir, device=TEST_DEVICE, dtype=torch.float32))


def test_served_with_adapters_equals_the_trainer_bitwise(folders):
    model_dir, made = folders
    llm = LLM(
        str(model_dir), device=TEST_DEVICE, batch_invariant=True, dtype="float32", max_num_batched_tokens=32
    )
    for name, folder in made.items():
        llm.load_adapter(name, str(folder))
    outputs = llm.generate(PROMPTS, SAMPLED, adapter=ADAPTERS)
    assert_served_invariant(llm)
    llm.engine.check_integrity()
    base = llm.generate(PROMPTS[:1], SAMPLED)[0]
    assert float32_bits(base.logprobs) != float32_bits(outputs[0].logprobs), "the adapter changed nothing"

    model = trainer_model(model_dir)
    adapters = {name: load_lora_adapter(name, folder, model) for name, folder in made.items()}
    trajectories = [
        Trajectory(o.prompt_ids, o.token_ids, name) for o, name in zip(outputs, ADAPTERS, strict=True)
    ]
    compared = 0
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [1, 3]):
        packed = PackedBatch.pack([trajectories[i] for i in order])
        result = trajectory_logprobs(model, packed, adapters=adapters)
        compared += assert_same_bits(result, outputs, order)
    assert compared == (4 + 4 + 2) * 6

    with pytest.raises(ValueError, match="adapters: trajectory 0 was served with adapter 'alpha'"):
        trajectory_logprobs(model, PackedBatch.pack(trajectories[:1]), adapters={"beta": adapters["beta"]})


def reference_loss(model, trajectories, adapter) -> torch.Tensor:
    """Sum of every token's log-prob after the first: default numerics, full-sequence forward, adapter on."""
    total = 0.0
    for trajectory in trajectories:
        ids = torch.tensor([trajectory.token_ids], device=TEST_DEVICE)
        logprobs = torch.log_softmax(model(ids, adapter=adapter)[0, :-1].float(), dim=-1)
        total = total + logprobs.gather(-1, ids[0, 1:, None]).sum()
    return total


def test_adapter_gradients_match_the_float32_reference(folders, tmp_path):
    model_dir, made = folders
    trajectories = [
        Trajectory(tuple(range(30, 30 + 20)), tuple(range(700, 710)), "alpha"),
        Trajectory(tuple(range(200, 209)), tuple(range(600, 612)), "alpha"),
    ]
    trained = trainer_model(model_dir).requires_grad_(False)  # the adapter alone learns
    adapter = load_lora_adapter("alpha", made["alpha"], trained)
    params = trainable_adapter(adapter)
    result = trajectory_logprobs(
        trained, PackedBatch.pack(trajectories), include_prompt=True, adapters={"alpha": adapter}
    )
    loss = result.logprobs[result.scored].sum()
    reference = load_model(model_dir, device=TEST_DEVICE, dtype=torch.float32).requires_grad_(False)
    ref_adapter = load_lora_adapter("alpha", made["alpha"], reference)
    ref_params = trainable_adapter(ref_adapter)
    want_loss = reference_loss(reference, trajectories, ref_adapter)
    assert relative_error(loss.detach(), want_loss.detach()) < 1e-5
    got = torch.autograd.grad(loss, params, allow_unused=True)
    want = torch.autograd.grad(want_loss, ref_params, allow_unused=True)
    modules = [m for m in sorted(adapter.pairs) for _ in "AB"]
    worst, compared, unused = 0.0, 0, set()
    for module, g, w in zip(modules, got, want, strict=True):
        # No gradient on either side: the DSA indexer only selects, and an expert no token chose.
        assert (g is None) == (w is None), f"{module}: a gradient on one side only"
        if g is None:
            unused.add(module)
            continue
        assert torch.isfinite(g).all(), f"{module}: non-finite gradient"
        assert w.abs().max() > 0, f"{module}: the reference gradient is zero (nothing compared)"
        error = relative_error(g, w)
        assert error < GRAD_RTOL, (module, error)
        worst, compared = max(worst, error), compared + 1
    for module in unused:
        assert ".indexer." in module or ".experts." in module, f"{module}: no gradient"
    assert any(".indexer." in m for m in unused), "the indexer's adapter got a gradient from a selection"
    learned = [m for m in set(modules) - unused]
    for part in (
        "q_proj",
        "o_proj",
        "kv_a_proj_with_mqa",
        "shared_experts",
        ".experts.",
        "f_a_proj",
        "b_proj",
    ):
        assert any(part in m for m in learned), f"no adapted {part} learned"
    print(
        f"adapter gradients: {compared} of {len(modules)} tensors compared, worst relative error {worst:.2e}"
    )

    # Written back as a PEFT folder and loaded again: the same tensors, exactly.
    with torch.no_grad():
        for param in params:
            param.mul_(1.5)
    again = load_lora_adapter("alpha", save_adapter(adapter, tmp_path / "updated"), trained)
    for module, pair in adapter.pairs.items():
        assert torch.equal(again.pairs[module].a, pair.a) and torch.equal(again.pairs[module].b, pair.b)
