"""A parallel engine as processes, through the real ``baton generate`` on the CPU (gloo): ``--tp 2`` gives
the one-rank greedy tokens, and so does ``--pcp 2`` for a 40-token prompt (zigzag chunks of 16: each
PCP rank computes real pieces) on tiny K3 (KDA + MLA + DSA) and DeepSeek-V3.2 (MLA + DSA), rank 0
counting its PCP exchanges (the prefill steps': decode steps run whole on every PCP rank);
``--tp 2 --ep 2`` and ``--pp 2`` with ``--batch-invariant`` give the one-rank tokens and log-prob bits
for a batch of K3 prompts; a follower that dies takes the group down
and rank 0 says which; rank 0 dying ends its followers; bad layouts fail before any rank starts."""

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
from services.engine.model import load_model_config
from services.engine.model.config import LAYER_KDA
from services.engine.parallel.rank_group import EXIT_GROUP_DOWN
from tests.parallel.counted_generate import EXCHANGES_PREFIX

REPO = Path(__file__).resolve().parents[2]
PROMPT = [(5 * i + 2) % 97 for i in range(11)]
LONG_PROMPT = [(5 * i + 2) % 97 for i in range(40)]  # > 32 tokens: pcp 2 splits it into real chunks
MAX_TOKENS = 6


def baton(
    *args: str, wait: bool = True, timeout: float = 120, module: str = "cli.main"
) -> subprocess.CompletedProcess | subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", module, *args]
    if not wait:
        return subprocess.Popen(
            command, cwd=REPO, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def generate_args(model: Path, *extra: str, prompt: list[int] = PROMPT) -> list[str]:
    ids = ",".join(map(str, prompt))
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
def one_rank_ids(tiny_checkpoint):
    """``one_rank_ids(family, prompt)``: the one-rank greedy tokens, computed once each."""
    made = {}

    def ids(family: str, prompt: list[int]) -> list[int]:
        if (family, len(prompt)) not in made:
            folder = str(tiny_checkpoint(family))
            with LLM(folder, dtype="float32", max_model_len=64, max_num_seqs=2) as llm:
                params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
                made[family, len(prompt)] = llm.generate([prompt], params)[0].token_ids
        return made[family, len(prompt)]

    return ids


# name -> (family, prompt, flags); the PCP runs count rank 0's exchanges (``counted_generate``)
DEGREES = {
    "tp2": ("k3", PROMPT, ("--tp", "2")),
    "pcp2": ("k3", LONG_PROMPT, ("--pcp", "2")),
    "pcp2-dsv32": ("deepseek_v32", LONG_PROMPT, ("--pcp", "2")),
}
INVARIANT = {"tp2-ep2": ("--tp", "2", "--ep", "2"), "pp2": ("--pp", "2")}


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> dict[str, Path]:
    """The batch-invariant runs' prompts (three lengths, one batch) and their dumps' paths."""
    root = tmp_path_factory.mktemp("invariant")
    lines = [json.dumps({"id": n, "prompt_ids": PROMPT[: 3 + 4 * n]}) for n in range(3)]
    (root / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    return {name: root / f"{name}.jsonl" for name in ("prompts", "one-rank", *INVARIANT)}


@pytest.fixture(scope="module")
def runs(model, dumps, tiny_checkpoint) -> dict[str, subprocess.Popen]:
    """Every multi-rank run of this file, started together (each rank pays the torch import): two to
    kill a rank of as soon as it has one (``kill-follower``, ``kill-rank-0``: the tests that run first),
    and the generations."""
    started = {}
    for name in ("kill-follower", "kill-rank-0"):  # first: their tests wait for them, the others run later
        started[name] = baton(*generate_args(model, "--tp", "2", "--max-tokens", "50"), wait=False)
    for name, (family, prompt, flags) in DEGREES.items():
        module = "tests.parallel.counted_generate" if "--pcp" in flags else "cli.main"
        args = generate_args(tiny_checkpoint(family), *flags, prompt=prompt)
        started[name] = baton(*args, wait=False, module=module)
    for name, flags in INVARIANT.items():
        args = invariant_dump_args(model, dumps["prompts"], dumps[name], *flags)
        started[f"{name}-invariant"] = baton(*args, wait=False)
    yield started
    for process in started.values():
        process.kill()
        process.communicate()


def _children(pid: int, timeout: float = 180.0) -> list[int]:
    """Rank 0's child processes, once it has started one (14 processes import torch at once here: on a
    loaded 2-core runner that took rank 0 over a minute)."""
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
def test_generate_on_two_ranks_gives_the_one_rank_greedy_tokens(runs, one_rank_ids, tiny_checkpoint, name):
    family, prompt, flags = DEGREES[name]
    stdout, stderr = runs[name].communicate(timeout=120)
    want = one_rank_ids(family, prompt)
    assert len(want) == MAX_TOKENS
    assert generated_ids(subprocess.CompletedProcess([], runs[name].returncode, stdout, stderr)) == want
    if "--pcp" in flags:  # rank 0 ran the prefill steps split (each layer's exchange once), no decode step
        counts = json.loads(stderr.strip().splitlines()[-1].removeprefix(EXCHANGES_PREFIX))
        types = load_model_config(tiny_checkpoint(family)).layer_types
        kda = sum(kind == LAYER_KDA for kind in types)
        # With KDA layers the first chunk ends on the last snapshot boundary (32 tokens); the 8-token
        # tail is a second step, all on PCP rank 0 (rank 1 only joins the exchanges).
        steps = 2 if kda else 1
        assert counts == {
            **({"PcpKda.short_conv": kda * steps, "PcpKda.forward": kda * steps} if kda else {}),
            "PcpMlaLayerCache.write": (len(types) - kda) * steps,
        }


@pytest.mark.parametrize("name", INVARIANT)
def test_batch_invariant_parallel_runs_give_the_one_rank_bits(runs, model, dumps, name):
    """DESIGN.md section 4: invariant mode's tokens and log-probs do not depend on the layout (PCP's
    KDA relays the exact state; a PP stage runs one process's ops on the same rows)."""
    _, stderr = runs[f"{name}-invariant"].communicate(timeout=120)
    assert runs[f"{name}-invariant"].returncode == 0, stderr
    if not dumps["one-rank"].exists():
        assert main(invariant_dump_args(model, dumps["prompts"], dumps["one-rank"])) == 0
    want, got = read_dump(dumps["one-rank"]).by_id(), read_dump(dumps[name]).by_id()
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
        (("--pp", "5"), "--pp 5: more pipeline stages than the model's 4 layers"),
        (
            ("--tp", "2", "--device", "cuda", "--kernels", "reference"),
            "--tp x --dcp x --pcp x --pp: 2 ranks need CUDA devices 0..1",
        ),
    ],
    ids=["tp-heads", "ep-divides", "pp-above-layers", "more-ranks-than-devices"],
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
