"""DCP through the engine, as processes: ``baton generate --dcp 2`` on the CPU (gloo) gives the greedy
tokens of one rank for tiny DeepSeek-V3.2 (MLA + DSA, with ``--ep 2``) and K3 (KDA + MLA + DSA)
checkpoints, and so does ``--dcp 2 --pcp 2`` for K3 (a colocated worker prefilling over the PCP ranks
and decoding with DCP on each: 4 ranks); its prefix cache hits on whole virtual blocks; ``--dcp`` with
``--batch-invariant`` is refused before any rank starts.

Blocks of 4 tokens, so at dcp 2 one block id covers 8 positions. Two prompts run one after the other
(``--max-num-seqs 1``): the first, 21 tokens, spans three virtual blocks and is longer than the tiny
preset's ``index_topk`` (16), so its decode rows attend a subset chosen by the distributed top-k; the
second shares its first 20 tokens, so one rank reuses 5 blocks of 4 (20 tokens) and dcp 2 reuses 2
virtual blocks of 8 (16 tokens; K3 restores the KDA snapshot taken there, kept among 4 snapshots while
the first prompt's decode takes more).
"""

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch

from cli.main import main
from mismatch import read_dump
from services.engine import LLM, SamplingParams
from services.engine.capacity import capacity_ledger
from services.engine.engine_config import EngineConfig
from services.engine.model.config import LAYER_KDA
from services.engine.model.config_loader import load_model_config
from tests.parallel.counted_generate import EXCHANGES_PREFIX
from tests.parallel.test_rank_group import _started_here, baton

# run -> (family, flags); deepseek_v32 also splits its routed experts over the two DCP ranks (they
# hold the same tokens' rows); k3-pcp2's first prompt (21 tokens) is split 16 + 5 over the PCP ranks.
DEGREES = {
    "deepseek_v32": ("deepseek_v32", ("--dcp", "2", "--ep", "2")),
    "k3": ("k3", ("--dcp", "2")),
    "k3-pcp2": ("k3", ("--dcp", "2", "--pcp", "2")),
}
FIRST = [(7 * i + 3) % 97 for i in range(21)]
PROMPTS = [FIRST, FIRST[:20] + [11, 42, 5]]
MAX_TOKENS = 6
SIZES = {"block_size": 4, "max_model_len": 64, "max_num_seqs": 1, "num_snapshots": 4}
CACHED = {1: 20, 2: 16}  # the second prompt's cached tokens at dcp 1 and dcp 2


def _flags() -> list[str]:
    sizes = [(f"--{name.replace('_', '-')}", str(value)) for name, value in SIZES.items()]
    return [flag for pair in sizes for flag in pair]


@pytest.fixture(scope="module")
def runs(tiny_checkpoint, tmp_path_factory) -> dict[str, tuple[subprocess.Popen, Path]]:
    """``baton generate --dcp 2`` of both prompts for each run, started together."""
    root = tmp_path_factory.mktemp("dcp-generate")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": n, "prompt_ids": p}) + "\n" for n, p in enumerate(PROMPTS)))
    started = {}
    for name, (family, degrees) in DEGREES.items():
        out = root / f"{name}.jsonl"
        args = ["generate", "--model", str(tiny_checkpoint(family)), "--prompts", str(prompts)]
        args += ["--out", str(out), "--ignore-eos", "--max-tokens", str(MAX_TOKENS), "--dtype", "float32"]
        module = "tests.parallel.counted_generate" if "--pcp" in degrees else "cli.main"
        started[name] = (baton(*args, *_flags(), *degrees, wait=False, module=module), out)
    yield started
    for process, _ in started.values():
        process.kill()
        process.communicate()


@pytest.mark.parametrize("name", DEGREES)
def test_dcp_2_generates_the_one_rank_greedy_tokens(runs, tiny_checkpoint, name):
    family, degrees = DEGREES[name]
    with LLM(str(tiny_checkpoint(family)), dtype="float32", **SIZES) as llm:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
        want = llm.generate(PROMPTS, params)
    process, out = runs[name]
    _, stderr = process.communicate(timeout=300)  # a hang guard: 8 ranks share 2 cores
    assert process.returncode == 0, stderr
    got = read_dump(out).by_id()
    assert sorted(got) == [0, 1]
    for n, output in enumerate(want):
        assert len(output.token_ids) == MAX_TOKENS
        assert list(got[n].token_ids) == output.token_ids, f"prompt {n}"
    assert [output.num_cached_tokens for output in want] == [0, CACHED[1]]
    assert [got[n].extra["num_cached_tokens"] for n in (0, 1)] == [0, CACHED[2]], "a hit on virtual blocks"
    if "--pcp" in degrees:  # rank 0 ran prefill steps split over the PCP ranks (every MLA layer gathered)
        counts = json.loads(stderr.strip().splitlines()[-1].removeprefix(EXCHANGES_PREFIX))
        mla = sum(kind != LAYER_KDA for kind in load_model_config(tiny_checkpoint(family)).layer_types)
        writes = counts.get("PcpMlaLayerCache.write", 0)
        assert writes > 0 and writes % mla == 0, counts


def test_dcp_with_batch_invariant_is_refused_before_any_rank_starts(tiny_checkpoint, capsys):
    argv = ["generate", "--model", str(tiny_checkpoint("k3")), "--prompt-ids", "1,2,3", "--dcp", "2"]
    assert main([*argv, "--batch-invariant"]) == 2
    assert "--dcp 2 with --batch-invariant" in capsys.readouterr().err
    assert not _started_here("services.engine.parallel.follower"), "a rank started"


@pytest.mark.parametrize("pcp", [1, 2], ids=lambda p: f"pcp{p}")
@pytest.mark.parametrize("dcp", [1, 2, 4])
def test_the_engine_pool_holds_the_blocks_capacity_counts(tiny_checkpoint, dcp, pcp):
    """A context of ``max_model_len`` tokens takes as many block ids of the engine's pool as
    ``baton capacity --dcp`` counts blocks per rank (``ceil(ceil(L / dcp) / B)``); PCP ranks each hold
    their DCP rank's share of the whole cache, so ``--pcp`` changes neither."""
    path = tiny_checkpoint("k3")
    sizes = {"block_size": 4, "max_model_len": 61, "max_num_seqs": 3}
    config = EngineConfig(model=str(path), **sizes, dcp=dcp, pcp=pcp)
    ledger = capacity_ledger(load_model_config(path), torch.float32, 4, "auto", False, 64, dcp=dcp)
    assert config.block_tokens == 4 * dcp
    per_rank_tokens = math.ceil(61 / dcp)
    assert config.blocks_per_sequence == ledger.kv_blocks(61) == math.ceil(per_rank_tokens / 4)
    assert config.pool_blocks == 3 * ledger.kv_blocks(61)
