"""A parallel engine as processes, through the real ``baton generate`` on the CPU (gloo): ``--tp 2`` gives
the one-rank greedy tokens, and ``--tp 2 --ep 2 --batch-invariant`` the one-rank tokens and log-prob bits
for a batch of prompts; a follower that dies takes the group down and rank 0 says which; rank 0 dying
ends its followers; bad layouts fail before any rank starts."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cli.main import main
from mismatch import read_dump
from services.engine import LLM, SamplingParams
from services.engine.parallel.rank_group import EXIT_GROUP_DOWN

REPO = Path(__file__).resolve().parents[2]
PROMPT = [(5 * i + 2) % 97 for i in range(11)]
MAX_TOKENS = 6


def baton(
    *args: str, wait: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess | subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "cli.main", *args]
    if not wait:
        return subprocess.Popen(
            command, cwd=REPO, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def generate_args(model: Path, *extra: str) -> list[str]:
    ids = ",".join(map(str, PROMPT))
    sizes = [
        "--max-tokens",
        str(MAX_TOKENS),
        "--dtype",
        "float32",
        "--max-model-len",
        "64",
        "--max-num-seqs",
        "2",
    ]
    return ["generate", "--model", str(model), "--prompt-ids", ids, "--ignore-eos", *sizes, *extra]


def invariant_dump_args(model: Path, prompts: Path, out: Path, *extra: str) -> list[str]:
    """A batch-invariant run of ``prompts`` written as a log-prob dump to ``out``."""
    sizes = ["--max-tokens", str(MAX_TOKENS), "--dtype", "float32", "--max-model-len", "64"]
    files = ["--prompts", str(prompts), "--out", str(out)]
    return [
        "generate",
        "--model",
        str(model),
        *files,
        "--ignore-eos",
        "--logprobs",
        "--batch-invariant",
        *sizes,
        *extra,
    ]


def generated_ids(result: subprocess.CompletedProcess) -> list[int]:
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip().splitlines()[-1]
    return [int(t) for t in line.split("ids: ")[1].split(",")]


@pytest.fixture(scope="module")
def model(tiny_checkpoint) -> Path:
    return tiny_checkpoint("k3")


@pytest.fixture(scope="module")
def one_rank_ids(model) -> list[int]:
    with LLM(str(model), dtype="float32", max_model_len=64, max_num_seqs=2) as llm:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
        return llm.generate([PROMPT], params)[0].token_ids


DEGREES = {"tp2": ("--tp", "2")}


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> dict[str, Path]:
    """The batch-invariant runs' prompts (three lengths, one batch) and their dumps' paths."""
    root = tmp_path_factory.mktemp("invariant")
    lines = [json.dumps({"id": n, "prompt_ids": PROMPT[: 3 + 4 * n]}) for n in range(3)]
    (root / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    return {name: root / f"{name}.jsonl" for name in ("prompts", "one-rank", "tp2-ep2")}


@pytest.fixture(scope="module")
def runs(model, dumps) -> dict[str, subprocess.Popen]:
    """Every multi-rank run of this file, started together (each rank pays the torch import): two to
    kill a rank of as soon as it has one (``kill-follower``, ``kill-rank-0``: the tests that run first),
    and the generations."""
    started = {name: baton(*generate_args(model, *flags), wait=False) for name, flags in DEGREES.items()}
    started["tp2-ep2-invariant"] = baton(
        *invariant_dump_args(model, dumps["prompts"], dumps["tp2-ep2"], "--tp", "2", "--ep", "2"), wait=False
    )
    for name in ("kill-follower", "kill-rank-0"):
        started[name] = baton(*generate_args(model, "--tp", "2", "--max-tokens", "50"), wait=False)
    yield started
    for process in started.values():
        process.kill()
        process.communicate()


def _children(pid: int, timeout: float = 60.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children:
            return [int(child) for child in children]
        time.sleep(0.05)
    raise AssertionError(f"rank 0 (pid {pid}) started no follower within {timeout}s")


def _started_here(module: str) -> list[int]:
    """This test process's children running ``python -m module``."""
    found = []
    for child in Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split():
        try:
            if module.encode() in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(int(child))
        except FileNotFoundError:
            pass  # exited meanwhile
    return found


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"  # exited, not yet reaped


def test_a_follower_that_dies_takes_the_group_down(runs):
    rank0 = runs["kill-follower"]
    (follower,) = _children(rank0.pid)
    os.kill(follower, signal.SIGKILL)
    _, stderr = rank0.communicate(timeout=15)
    assert rank0.returncode == EXIT_GROUP_DOWN, stderr
    assert f"rank 1 of 2 (pid {follower}) died (signal 9); taking the rank group down" in stderr


def test_rank_0_dying_ends_its_followers(runs):
    rank0 = runs["kill-rank-0"]
    (follower,) = _children(rank0.pid)
    rank0.kill()
    rank0.communicate()
    deadline = time.monotonic() + 5
    while not _gone(follower) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(follower), f"follower {follower} outlived rank 0 by 5 s"


@pytest.mark.parametrize("name", DEGREES)
def test_generate_on_two_ranks_gives_the_one_rank_greedy_tokens(runs, one_rank_ids, name):
    stdout, stderr = runs[name].communicate(timeout=120)
    assert len(one_rank_ids) == MAX_TOKENS
    assert (
        generated_ids(subprocess.CompletedProcess([], runs[name].returncode, stdout, stderr)) == one_rank_ids
    )


def test_batch_invariant_tp_and_ep_give_the_one_rank_bits(runs, model, dumps):
    """DESIGN.md section 4: invariant mode's tokens and log-probs do not depend on the TP degree."""
    _, stderr = runs["tp2-ep2-invariant"].communicate(timeout=120)
    assert runs["tp2-ep2-invariant"].returncode == 0, stderr
    assert main(invariant_dump_args(model, dumps["prompts"], dumps["one-rank"])) == 0
    want, got = read_dump(dumps["one-rank"]).by_id(), read_dump(dumps["tp2-ep2"]).by_id()
    assert sorted(got) == sorted(want) == [0, 1, 2]
    for request_id, record in want.items():
        assert len(record.token_ids) == MAX_TOKENS and record.logprob_bits is not None
        assert (got[request_id].token_ids, got[request_id].logprob_bits) == (
            record.token_ids,
            record.logprob_bits,
        ), request_id


@pytest.mark.parametrize(
    "flags, message",
    [
        (("--tp", "3"), "--tp 3: does not divide 4 attention heads"),
        (("--tp", "2", "--ep", "4"), "--ep: 4 must divide tp x dcp = 2"),
        (("--pp", "2"), "--pp 2: not supported yet"),
        (
            ("--tp", "2", "--device", "cuda", "--kernels", "reference"),
            "--tp x --dcp x --pcp x --pp: 2 ranks need CUDA devices 0..1",
        ),
    ],
    ids=["tp-heads", "ep-divides", "pp-unsupported", "more-ranks-than-devices"],
)
def test_bad_layouts_fail_before_any_rank_starts(model, flags, message, capsys):
    if "cuda" in flags and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has the devices")
    assert main(generate_args(model, *flags)) == 2
    assert message in capsys.readouterr().err
    assert not _started_here("services.engine.parallel.follower"), "a rank started"


def test_serve_checks_each_roles_layout_before_starting_workers(model, capsys):
    argv = ["serve", "--model", str(model), "--port", "0", "--colocated", "--decode-parallel", "tp=2,ep=4"]
    assert main(argv) == 2
    assert "ep: 4 must divide tp x dcp = 2" in capsys.readouterr().err
    assert main([*argv[:-1], "tp=3"]) == 2
    assert "--tp 3: does not divide 4 attention heads" in capsys.readouterr().err
    # Other children of this process (multiprocessing's resource tracker, earlier tests' helpers) may
    # exist: what must not is a worker (``python -m cli.main worker``) or a rank.
    assert not _started_here("cli.main\x00worker"), "a worker started"
    assert not _started_here("services.engine.parallel.follower"), "a rank started"
