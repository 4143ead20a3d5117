"""``baton train`` / ``trainer.pretrain`` on the tiny k3 preset and a stand-in corpus: the loss falls, a
stopped and resumed run ends with the parameters of an uninterrupted one (bitwise), the checkpoint loads
in ``LLM`` and generates, shards keep their size limit, distillation lowers KL and resumes the same way, bad
flags name the flag."""

import dataclasses

import pytest
import torch

from cli.main import main as baton
from common.sampling_params import SamplingParams
from common.tokenizer import write_tiny_tokenizer
from services.engine import LLM
from services.engine.checkpoint.loader import load_model
from services.engine.model.causal_lm import FLOAT32_PARAMETERS
from tests.conftest import TEST_DEVICE
from trainer.loss_curve import read_points
from trainer.pretrain import run_segment
from trainer.pretrain_settings import PretrainSettings
from trainer.token_windows import TokenWindows
from trainer.train_state import STATE_FILE
from trainer.window_loss import distillation_loss, language_model_loss, window_logits

CORPUS = "tests.trainer.standin_corpus"
STEPS = 8


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tokenizer")
    write_tiny_tokenizer(folder, "k3", 1024)
    return folder


def micro(out, tokenizer, **changes) -> PretrainSettings:
    """A few steps of the tiny preset: windows of 32 tokens (over its index_topk of 16), batches of 4."""
    base = PretrainSettings(
        out=out, tokenizer=tokenizer, corpus=CORPUS, preset="tiny", seq_len=32, batch_size=4, steps=STEPS,
        lr=3e-3, warmup=2, eval_every=4, eval_windows=4,
    )  # fmt: skip
    return dataclasses.replace(base, **changes)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tokenizer_dir):
    """An uninterrupted micro run (its folder)."""
    out = tmp_path_factory.mktemp("uninterrupted")
    result = run_segment(micro(out, tokenizer_dir))
    assert result.finished and result.steps_run == STEPS
    return out


def fixed_windows(out) -> torch.Tensor:
    return TokenWindows(torch.load(out / "train_tokens.pt")["tokens"], 32, 0, "test").first(8)


def test_training_lowers_the_loss(trained, tokenizer_dir, tmp_path):
    untrained = run_segment(micro(tmp_path, tokenizer_dir, max_minutes=1e-9))
    assert untrained.steps_run == 0  # the time limit stops it before a step: its checkpoint is the init
    windows = fixed_windows(trained)
    with torch.no_grad():
        before = language_model_loss(load_model(untrained.checkpoint, dtype=torch.float32), windows)
        after = language_model_loss(load_model(trained / "checkpoint", dtype=torch.float32), windows)
    assert float(after) < float(before) - 0.3, (float(before), float(after))
    rows = (trained / "loss.csv").read_text().splitlines()
    assert rows[0].startswith("step,tokens") and len(rows) == 1 + STEPS // 4
    assert (trained / "loss.png").stat().st_size > 1000


def test_resumed_run_equals_the_uninterrupted_one(trained, tokenizer_dir, tmp_path):
    first = run_segment(micro(tmp_path, tokenizer_dir, stop_after=3))
    assert not first.finished and first.progress.step == 3 and first.progress.windows_seen == 12
    second = run_segment(micro(tmp_path, tokenizer_dir))
    assert second.finished and second.steps_run == STEPS - 3
    resumed = torch.load(tmp_path / STATE_FILE, weights_only=True)
    whole = torch.load(trained / STATE_FILE, weights_only=True)
    assert resumed["progress"] == whole["progress"]
    for name, tensor in whole["model"].items():
        assert torch.equal(resumed["model"][name], tensor), name
    assert (tmp_path / "loss.csv").read_text() == (trained / "loss.csv").read_text()


def test_checkpoint_loads_and_generates(trained):
    checkpoint = trained / "checkpoint"
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in checkpoint.iterdir()
    }
    with LLM(str(checkpoint), device=TEST_DEVICE) as llm:
        assert llm.engine.model.dtype == torch.bfloat16
        out = llm.generate(["The robot"], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))[0]
    assert len(out.token_ids) == 6 and isinstance(out.text, str)


def test_shards_keep_the_size_limit(trained, tokenizer_dir):
    limit_mib = 0.1
    result = run_segment(micro(trained, tokenizer_dir, max_shard_mib=limit_mib))  # finished: only exports
    assert result.steps_run == 0
    files = sorted((trained / "checkpoint").glob("*.safetensors"))
    assert len(files) > 3 and (trained / "checkpoint" / "model.safetensors.index.json").is_file()
    assert all(file.stat().st_size <= limit_mib * 2**20 for file in files)
    reloaded = load_model(trained / "checkpoint", dtype=torch.float32).state_dict()
    state = torch.load(trained / STATE_FILE, weights_only=True)["model"]
    for name, tensor in state.items():  # bf16 on disk, except the parameters the loader keeps in float32
        stored = tensor if name.endswith(FLOAT32_PARAMETERS) else tensor.to(torch.bfloat16).float()
        assert torch.equal(reloaded[name], stored), name


def test_distillation_lowers_the_kl_and_resumes(trained, tmp_path):
    settings = micro(tmp_path, None, distill_from=trained / "checkpoint", seed=1, lr=5e-3)
    untrained = run_segment(dataclasses.replace(settings, out=tmp_path / "init", max_minutes=1e-9))
    assert not run_segment(dataclasses.replace(settings, stop_after=3)).finished
    result = run_segment(settings)
    assert result.finished and result.steps_run == STEPS - 3
    whole = run_segment(dataclasses.replace(settings, out=tmp_path / "whole"))
    resumed, uninterrupted = (
        torch.load(out / STATE_FILE, weights_only=True) for out in (tmp_path, whole.checkpoint.parent)
    )
    assert all(torch.equal(resumed["model"][k], v) for k, v in uninterrupted["model"].items())
    windows = fixed_windows(trained)
    with torch.no_grad():
        target = window_logits(load_model(trained / "checkpoint", dtype=torch.float32), windows)
        kl = [
            float(distillation_loss(window_logits(load_model(folder, dtype=torch.float32), windows), target))
            for folder in (untrained.checkpoint, result.checkpoint)
        ]
    assert kl[1] < 0.8 * kl[0], kl
    points = read_points(tmp_path / "loss.csv")  # the curve's objective is the KL, beside the cross-entropy
    assert len(points) == STEPS // 4 and all(p.heldout_loss < p.heldout_nll for p in points)


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--seq-len", "1"], "--seq-len"),
        (["--warmup", "5000"], "--warmup"),
        (["--corpus", "no.such.corpus"], "--corpus"),
        (["--preset", "huge"], "--preset"),
        (["--tokenizer", "/nonexistent"], "--tokenizer"),
        (["--distill-from", "/nonexistent"], "--distill-from"),
        (["--device", "tpu"], "--device"),
    ],
    ids=["seq-len", "warmup", "corpus", "preset", "tokenizer", "distill-from", "device"],
)
def test_bad_flags_name_the_flag(flags, named, tokenizer_dir, tmp_path, capsys):
    argv = ["train", "--out", str(tmp_path), "--tokenizer", str(tokenizer_dir), "--preset", "tiny", *flags]
    assert baton(argv) == 2
    assert named in capsys.readouterr().err


def test_resuming_with_other_settings_names_the_flag(trained, tokenizer_dir, capsys):
    argv = ["train", "--out", str(trained), "--tokenizer", str(tokenizer_dir), "--preset", "tiny"]
    argv += [
        "--corpus",
        CORPUS,
        "--seq-len",
        "32",
        "--batch-size",
        "4",
        "--steps",
        str(STEPS),
        "--warmup",
        "2",
    ]
    assert baton([*argv, "--lr", "1e-3"]) == 2
    assert "--lr" in capsys.readouterr().err
