"""The ``baton`` command line: outputs, determinism and user errors. Commands run in this process
through ``cli.main.main`` (what the console script calls); the cases where the process boundary is the
point (an environment without a visible GPU, a forced interpreter) run ``python -m cli.main``."""

import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch

from cli.main import main
from mismatch import read_dump
from services.engine.checkpoint.loader import load_model
from tests.conftest import FAMILIES

REPO = Path(__file__).resolve().parents[2]


class Ran(NamedTuple):
    """One ``baton`` command's exit status and what it printed."""

    returncode: int
    stdout: str
    stderr: str


def baton(*args: str) -> Ran:
    """``baton *args`` in this process; an exception the command does not turn into a status fails the
    test (as a traceback on stderr would)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(list(args))
        except SystemExit as exit_:  # argparse: 2 on a usage error, 0 after --help
            code = exit_.code
    return Ran(code, stdout.getvalue(), stderr.getvalue())


def _digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(folder.iterdir()):
        digest.update(file.name.encode() + file.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def k3_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "k3"
    result = baton(
        "checkpoint", "init", "--family", "k3", "--preset", "tiny", "--seed", "3", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    return out


def test_console_script_runs_outside_the_checkout(tmp_path):
    """The installed `baton` imports every command's modules from the installed packages, not from the
    working directory (a module left out of pyproject's packages fails here, not in `make run`)."""
    script = shutil.which("baton", path=str(Path(sys.executable).parent))
    assert script, "pip install -e . should provide `baton`"
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run([script, "--help"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "eval" in result.stdout and "train" in result.stdout


@pytest.mark.parametrize("family", FAMILIES)
def test_checkpoint_init_writes_a_complete_folder(family, tmp_path):
    result = baton(
        "checkpoint", "init", "--family", family, "--preset", "tiny", "--seed", "1", "--out", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).is_file(), name
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["eos_token_id"] and all(0 <= i < config["vocab_size"] for i in config["eos_token_id"])
    assert load_model(tmp_path).config.family == family


def test_checkpoint_init_is_deterministic_per_seed(tmp_path):
    folders = {}
    for name, seed in (("a", "5"), ("b", "5"), ("c", "6")):
        folders[name] = tmp_path / name
        assert (
            baton(
                "checkpoint", "init", "--family", "deepseek_v32", "--seed", seed, "--out", str(folders[name])
            ).returncode
            == 0
        )
    assert _digest(folders["a"]) == _digest(folders["b"])
    assert _digest(folders["a"]) != _digest(folders["c"])


def test_logits_match_the_model_and_need_no_tokenizer(k3_dir, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(k3_dir, bare)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (bare / name).unlink()
    out = tmp_path / "logits.npy"
    result = baton(
        "logits", "--model", str(bare), "--input-ids", "5,17,42", "--dtype", "float32", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    logits = np.load(out)
    assert logits.shape == (3, 1024) and logits.dtype == np.float32
    with torch.no_grad():
        want = load_model(k3_dir, dtype=torch.float32)(torch.tensor([[5, 17, 42]]))[0].numpy()
    assert np.array_equal(logits, want)


LOGITS_ERRORS = {
    "out-of-vocab": (
        ["--input-ids", "5,17,4096"],
        "--input-ids: id 4096 at position 2 is outside the vocabulary",
    ),
    "negative-id": (["--input-ids", "-3"], "--input-ids: id -3 at position 0"),
    "not-integers": (["--input-ids", "5,x"], "--input-ids: expected comma-separated integers"),
    "empty-item": (["--input-ids", "5,,6"], "--input-ids: expected comma-separated token ids"),
}


@pytest.mark.parametrize("case", list(LOGITS_ERRORS), ids=list(LOGITS_ERRORS))
def test_logits_user_errors(case, k3_dir, tmp_path):
    extra, message = LOGITS_ERRORS[case]
    result = baton("logits", "--model", str(k3_dir), *extra, "--out", str(tmp_path / "x.npy"))
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "x.npy").exists()


def test_logits_on_missing_folder_and_bad_config(tmp_path):
    result = baton(
        "logits", "--model", str(tmp_path / "nope"), "--input-ids", "1", "--out", str(tmp_path / "x.npy")
    )
    assert result.returncode == 2 and "config.json" in result.stderr and "Traceback" not in result.stderr
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    result = baton("logits", "--model", str(tmp_path), "--input-ids", "1", "--out", str(tmp_path / "x.npy"))
    assert result.returncode == 2 and "model_type: 'gpt2' is not supported" in result.stderr


def test_unknown_family_is_an_argument_error(tmp_path):
    result = baton("checkpoint", "init", "--family", "llama", "--out", str(tmp_path))
    assert result.returncode == 2 and "--family" in result.stderr


def _generated_ids(stdout: str) -> list[int]:
    line = [line for line in stdout.splitlines() if "generated" in line][-1]
    return [int(i) for i in line.split("ids: ")[1].split(",")]


def test_generate_greedy_matches_full_forward_argmax(k3_dir):
    result = baton("generate", "--model", str(k3_dir), "--prompt-ids", "10,20,30,40", "--max-tokens", "6")
    assert result.returncode == 0, result.stderr
    generated = _generated_ids(result.stdout)
    model = load_model(k3_dir, dtype=torch.float32)
    sequence = [10, 20, 30, 40]
    with torch.no_grad():
        for token in generated:
            assert token == int(model(torch.tensor([sequence]))[0, -1].argmax())
            sequence.append(token)


def test_generate_from_text_and_chat(k3_dir):
    for extra in ([], ["--chat"]):
        result = baton(
            "generate", "--model", str(k3_dir), "--prompt", "Hello, Baton!", "--max-tokens", "4", *extra
        )
        assert result.returncode == 0, result.stderr
        assert "prompt tokens" in result.stdout and len(_generated_ids(result.stdout)) >= 1


def test_generate_errors(k3_dir):
    result = baton("generate", "--model", str(k3_dir), "--prompt-ids", "1,2", "--max-tokens", "0")
    assert result.returncode == 2 and "--max-tokens: must be >= 1" in result.stderr
    result = baton("generate", "--model", str(k3_dir), "--prompt-ids", "1,99999")
    assert result.returncode == 2 and "--prompt-ids: id 99999" in result.stderr


def test_generate_takes_logit_bias_and_penalties(k3_dir):
    prompt = ("--model", str(k3_dir), "--prompt-ids", "10,20,30,40", "--max-tokens", "4")
    result = baton("generate", *prompt, "--logit-bias", "7:100", "--frequency-penalty", "0.5")
    assert result.returncode == 0, result.stderr
    assert _generated_ids(result.stdout) == [7, 7, 7, 7]
    result = baton("generate", *prompt, "--repetition-penalty", "0")
    assert result.returncode == 2 and "--repetition-penalty: must be a finite number > 0" in result.stderr
    result = baton("generate", *prompt, "--logit-bias", "7=1")
    assert result.returncode == 2 and "--logit-bias: expected ID:BIAS pairs" in result.stderr


def test_kernel_flags_are_checked_at_start(k3_dir, monkeypatch):
    result = baton("generate", "--model", str(k3_dir), "--prompt-ids", "1,2", "--kernels", "fast")
    assert result.returncode == 2 and "--kernels: invalid choice: 'fast'" in result.stderr
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the check reads the environment at start
    result = baton(
        "generate", "--model", str(k3_dir), "--prompt-ids", "1,2", "--kernels", "triton", "--max-tokens", "1"
    )
    assert result.returncode == 2 and "--kernels: triton on the CPU" in result.stderr
    assert "TRITON_INTERPRET=1" in result.stderr


def test_bench_kernels_refuses_unknown_ops_and_non_cuda_devices():
    result = baton("bench", "kernels", "--ops", "copy,warp")
    assert result.returncode == 2 and "--ops: unknown op 'warp'" in result.stderr
    result = baton("bench", "kernels", "--ops", "mla", "--device", "cpu")
    assert result.returncode == 2
    assert "--device: baton bench kernels needs a CUDA device (cuda or cuda:N), got 'cpu'" in result.stderr
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "bench", "kernels", "--ops", "kda"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO), CUDA_VISIBLE_DEVICES=""),
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 2
    assert "--device: baton bench kernels needs a CUDA device, and none is visible" in result.stderr


def test_bench_kernels_help_lists_every_op():
    result = baton("bench", "kernels", "--help")
    assert result.returncode == 0
    for op in ("copy", "matmul", "mla", "indexer", "kda", "moe", "sampling", "invariant"):
        assert f"\n  {op} " in result.stdout


def test_bench_engine_compares_backends_side_by_side(tmp_path):
    # One batch size, of two sequences (the varlen path): the interpreted Triton rows take most of this
    # test's time, and a second batch size only repeats the same loop.
    report = tmp_path / "engine.json"
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "bench", "engine", "--family", "kimi_linear", "--batches", "2"]
        + [
            "--contexts",
            "16",
            "--decode-tokens",
            "1",
            "--kernels",
            "reference,triton",
            "--json",
            str(report),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO), TRITON_INTERPRET="1"),
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert "step/bound" in result.stdout and "baton/peer" in result.stdout
    data = json.loads(report.read_text())
    assert [(r["kernels"], r["batch"]) for r in data["rows"]] == [("reference", 2), ("triton", 2)]
    assert data["weight_bytes"] > 0 and data["copy_bytes_per_s"] > 0
    assert data["peer"].startswith("none (the peer runs fla-core")


def test_generate_jsonl_round_trips_logprobs_exactly(k3_dir, tmp_path):
    prompts = tmp_path / "in.jsonl"
    prompts.write_text('{"id": "a", "prompt_ids": [3, 4, 5]}\n\n{"id": 2, "prompt": "Hello there"}\n')
    out = tmp_path / "out.jsonl"
    result = baton(
        "generate",
        "--model",
        str(k3_dir),
        "--prompts",
        str(prompts),
        "--out",
        str(out),
        "--max-tokens",
        "5",
        "--logprobs",
        "--ignore-eos",
        "--batch-invariant",
    )
    assert result.returncode == 0, result.stderr
    dump = read_dump(out)
    records = dump.records
    assert [r.request_id for r in records] == ["a", 2]
    assert dump.environment.numerics == "batch_invariant" and dump.environment.dtype == "float32"
    from services.engine import LLM, SamplingParams

    llm = LLM(str(k3_dir), batch_invariant=True)
    want = llm.generate(
        [[3, 4, 5]], SamplingParams(max_tokens=5, temperature=0, logprobs=0, ignore_eos=True)
    )[0]
    assert list(records[0].token_ids) == want.token_ids and list(records[0].prompt_ids) == [3, 4, 5]
    assert list(records[0].logprobs) == want.logprobs  # exact float equality after the JSON round trip
    want_bits = torch.tensor(want.logprobs, dtype=torch.float32).view(torch.int32).tolist()
    assert [b - (1 << 32) if b >= 1 << 31 else b for b in records[0].logprob_bits] == want_bits
    assert all(len(r.token_ids) == 5 and r.extra["finish_reason"] == "length" for r in records)


JSONL_ERRORS = {
    "bad-json": ('{"id": 1, "prompt_ids": [1,\n', "line 1: not valid JSON"),
    "both-fields": ('{"prompt": "x", "prompt_ids": [1]}\n', "line 1: needs exactly one of"),
    "ids-not-ints": ('{"prompt_ids": [1, "2"]}\n', "line 1: prompt_ids must be a non-empty list of integers"),
    "empty-file": ("\n", "holds no prompts"),
    "out-of-vocab": ('{"prompt_ids": [1, 99999]}\n', "prompt_ids: id 99999 at position 1"),
}


@pytest.mark.parametrize("case", list(JSONL_ERRORS), ids=list(JSONL_ERRORS))
def test_generate_jsonl_errors(case, k3_dir, tmp_path):
    content, message = JSONL_ERRORS[case]
    prompts = tmp_path / "in.jsonl"
    prompts.write_text(content)
    result = baton(
        "generate", "--model", str(k3_dir), "--prompts", str(prompts), "--out", str(tmp_path / "o.jsonl")
    )
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_generate_jsonl_needs_out(k3_dir, tmp_path):
    result = baton("generate", "--model", str(k3_dir), "--prompts", str(tmp_path / "in.jsonl"))
    assert result.returncode == 2 and "--out: required with --prompts" in result.stderr
