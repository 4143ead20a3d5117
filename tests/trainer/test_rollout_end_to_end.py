"""Issue 14's loop, RL-shaped, through the command line: ``baton generate`` serves a batch-invariant rollout
with a LoRA adapter (adapted and base requests in one batch) into a dump; the trainer recomputes it and
writes its own; ``baton mismatch --mode rollout`` finds 0 mismatches, not VACUOUS; ``baton score``
rescoring the served dump matches it too (``--mode scorer``). Then one SGD step on the adapter's A/B
alone (policy gradient, fixed advantages), the adapter written back as a PEFT folder and served again:
the served log-probs move as the trainer's gradient predicts to first order, the base request's do
not move at all (bitwise), and the trainer still reproduces the new served bits."""

import json

import torch

from cli.main import main
from mismatch import read_dump
from services.engine.adapters.lora_adapter import load_lora_adapter
from services.engine.checkpoint.fingerprint import checkpoint_fingerprint
from services.engine.checkpoint.loader import load_model
from tests.conftest import TEST_DEVICE
from tests.lora_adapters import random_pairs, write_peft_adapter
from trainer import (
    PackedBatch,
    make_trainable,
    read_trajectories,
    save_adapter,
    trainable_adapter,
    trajectory_logprobs,
    write_trainer_dump,
)

RANK, ALPHA = 4, 8.0
MAX_TOKENS = 6
PROMPTS = [  # (id, prompt ids, adapter)
    ("a", list(range(30, 30 + 37)), "policy"),
    ("b", list(range(200, 212)), ""),
    ("c", list(range(400, 420)), "policy"),
]
ADVANTAGES = {"a": 1.0, "c": -1.0}  # the base request is not trained on
# The predicted first-order rise of the objective: small, so no MoE or DSA choice (nor sampled token) flips.
OBJECTIVE_RISE = 0.005
ENGINE = [
    "--device",
    TEST_DEVICE,
    "--dtype",
    "float32",
    "--batch-invariant",
    "--max-num-batched-tokens",
    "32",
]


def run_cli(capsys, *args) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(args))
    return code, capsys.readouterr().out


def generate(capsys, checkpoint, folder, out, tmp_path) -> dict:
    prompts = tmp_path / "prompts.jsonl"
    lines = [{"id": i, "prompt_ids": p, **({"adapter": a} if a else {})} for i, p, a in PROMPTS]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, _ = run_cli(
        capsys,
        *("generate", "--model", str(checkpoint), "--prompts", str(prompts), "--out", str(out)),
        *("--adapters", f"policy={folder}", "--logprobs", "--ignore-eos", "--max-tokens", str(MAX_TOKENS)),
        *("--temperature", "1.0", "--seed", "5", *ENGINE),
    )
    assert code == 0
    return {record.request_id: record for record in read_dump(out).records}


def mismatch(capsys, mode, a, b) -> dict:
    code, out = run_cli(capsys, "mismatch", "--mode", mode, str(a), str(b), "--json")
    report = json.loads(out)
    assert code == 0, report
    assert report["mismatched"] == 0 and report["vacuous"] is False, report
    assert report["compared_tokens"] == len(PROMPTS) * MAX_TOKENS == report["bitwise_equal"], report
    return report


def trainer_dump(model, adapter, served_path, out, checkpoint):
    served = read_trajectories(served_path)
    assert [t.adapter for _, t in served] == [a for _, _, a in PROMPTS]
    result = trajectory_logprobs(
        model, PackedBatch.pack([t for _, t in served]), adapters={"policy": adapter}
    )
    ids = [i for i, _ in served]
    write_trainer_dump(
        out, result, ids, model, checkpoint=checkpoint_fingerprint(checkpoint), adapters={"policy": adapter}
    )
    return ids, result


def test_rollout_recompute_mismatch_and_one_lora_step(tiny_checkpoint, tmp_path, capsys):
    checkpoint = tiny_checkpoint("k3")
    v0 = write_peft_adapter(tmp_path / "policy-v0", random_pairs(checkpoint, RANK, seed=3), RANK, ALPHA)
    served_path = tmp_path / "served.jsonl"
    before = generate(capsys, checkpoint, v0, served_path, tmp_path)

    model = make_trainable(load_model(checkpoint, device=TEST_DEVICE, dtype=torch.float32))
    model.requires_grad_(False)  # only the adapter learns
    adapter = load_lora_adapter("policy", v0, model)
    params = trainable_adapter(adapter)
    trainer_path = tmp_path / "trainer.jsonl"
    ids, result = trainer_dump(model, adapter, served_path, trainer_path, checkpoint)
    report = mismatch(capsys, "rollout", served_path, trainer_path)
    assert report["environment_diff"]["kv_format"]["allowed"] is True

    # The scorer: the served dump rescored in one prefill each, bitwise what generation reported.
    score_path = tmp_path / "score.jsonl"
    code, _ = run_cli(
        capsys,
        *("score", "--model", str(checkpoint), "--prompts", str(served_path), "--out", str(score_path)),
        *("--adapters", f"policy={v0}", *ENGINE),
    )
    assert code == 0 and {r.path for r in read_dump(score_path).records} == {"score"}
    mismatch(capsys, "scorer", score_path, served_path)

    # J = sum_i A_i * (sum of trajectory i's generated log-probs); one SGD ascent step on the LoRA A/B.
    per_trajectory = {}
    for index, request_id in enumerate(ids):
        grads = torch.autograd.grad(
            result.of_generated(index).sum(), params, retain_graph=True, allow_unused=True
        )
        per_trajectory[request_id] = [
            torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)
        ]
    assert all(float(g.abs().max()) == 0 for g in per_trajectory["b"]), "a base row reached the adapter"
    direction = [sum(a * per_trajectory[i][k] for i, a in ADVANTAGES.items()) for k in range(len(params))]
    norm2 = sum(float((d.double() ** 2).sum()) for d in direction)
    lr = OBJECTIVE_RISE / norm2
    predicted = {
        i: lr * sum(float((g.double() * d.double()).sum()) for g, d in zip(grads, direction, strict=True))
        for i, grads in per_trajectory.items()
    }
    with torch.no_grad():
        for param, step in zip(params, direction, strict=True):
            param.add_(lr * step)
    v1 = save_adapter(adapter, tmp_path / "policy-v1")

    served_again = tmp_path / "served-v1.jsonl"
    after = generate(capsys, checkpoint, v1, served_again, tmp_path)
    for request_id, old in before.items():
        assert after[request_id].token_ids == old.token_ids, "the step changed a sampled token: too large"
    assert after["b"].logprob_bits == before["b"].logprob_bits, "the base request's log-probs moved"
    moved = {i: sum(after[i].logprobs) - sum(before[i].logprobs) for i in ADVANTAGES}
    objective = sum(a * moved[i] for i, a in ADVANTAGES.items())
    assert abs(objective - OBJECTIVE_RISE) < 0.2 * OBJECTIVE_RISE, (objective, OBJECTIVE_RISE)
    scale = max(abs(predicted[i]) for i in ADVANTAGES)
    for i in ADVANTAGES:
        assert abs(moved[i] - predicted[i]) < 0.2 * scale, (
            f"{i}: served moved {moved[i]:.4g}, predicted {predicted[i]:.4g}"
        )
    assert moved["a"] > 0, "the positive-advantage trajectory's served log-probs should rise"
    with capsys.disabled():
        print(
            f"objective rise {objective:.6g} (predicted {OBJECTIVE_RISE}); moved {moved}; "
            f"predicted {predicted}"
        )

    # The updated adapter, reloaded from its folder: the trainer reproduces the new served bits.
    updated = load_lora_adapter("policy", v1, model)
    with torch.no_grad():
        trainer_dump(model, updated, served_again, tmp_path / "trainer-v1.jsonl", checkpoint)
    mismatch(capsys, "rollout", served_again, tmp_path / "trainer-v1.jsonl")
