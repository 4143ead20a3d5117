"""The tool-calling agent workload: prompts are the model's chat template rendering of growing agent runs
(declared tools, tool calls, tool results of the drawn sizes), for the Kimi and DeepSeek layouts; bad
options name themselves; ``baton loadtest --workload tool_agent`` drives a cluster with it."""

import json
from pathlib import Path

import pytest

from cli.main import main
from common.tokenizer import Tokenizer
from loadtest.workloads import build_workload
from loadtest.workloads.tool_agent import TOOLS, tool_agent

DEMO = Path(__file__).resolve().parents[2] / "models" / "k3-demo"  # the shipped model's real tokenizer
SMALL = {"task_len": 16, "result_median": 32, "result_max": 64}


@pytest.mark.parametrize(
    "family, call_marker", [("k3", "<|tool_call_begin|>"), ("deepseek_v32", "<｜tool▁call▁begin｜>")]
)
def test_prompts_render_growing_agent_runs_with_the_family_template(tiny_checkpoint, family, call_marker):
    model = tiny_checkpoint(family)
    tokenizer = Tokenizer.from_pretrained(model)
    workload = tool_agent(model, num_sessions=3, turns=4, output_len=8, vocab=200, seed=5, **SMALL)
    opening = tokenizer.encode_chat([{"role": "user", "content": "x"}])
    generation_prompt = len(opening) - len(
        tokenizer.encode_chat([{"role": "user", "content": "x"}], None, False)
    )
    for session in workload.sessions:
        texts = [tokenizer.decode(turn.prompt_ids) for turn in session.turns]
        for k, text in enumerate(texts):
            assert text.count(call_marker) == k  # one tool call (and its result) per earlier turn
            assert all(tool["function"]["name"] in text for tool in TOOLS)  # the tools are declared
        for before, after in zip(session.turns, session.turns[1:], strict=False):
            kept = before.prompt_ids[: len(before.prompt_ids) - generation_prompt]
            assert after.prompt_ids[: len(kept)] == kept  # each turn extends the conversation
        assert [turn.delay_s for turn in session.turns] == [0.0, 0.5, 0.5, 0.5]
    first, second = (s.turns[0].prompt_ids for s in workload.sessions[:2])
    shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    system = tokenizer.decode(first[:shared])
    assert "run_shell" in system and "coding agent" in system  # tools and system prompt are shared
    again = tool_agent(model, num_sessions=3, turns=4, output_len=8, vocab=200, seed=5, **SMALL)
    other = tool_agent(model, num_sessions=3, turns=4, output_len=8, vocab=200, seed=6, **SMALL)
    assert again.sessions == workload.sessions and other.sessions != workload.sessions


def test_tool_results_take_the_drawn_number_of_tokens():
    """With no spread every result is ``result_median`` tokens; a turn grows by it plus the call."""
    tokenizer = Tokenizer.from_pretrained(DEMO)
    workload = tool_agent(
        tokenizer, 2, turns=5, output_len=32, vocab=12000, result_median=500, result_sigma=0.0
    )
    for session in workload.sessions:
        lengths = [len(turn.prompt_ids) for turn in session.turns]
        growth = [b - a for a, b in zip(lengths, lengths[1:], strict=False)]
        assert all(500 <= g <= 500 * 1.1 + 80 for g in growth), growth
    assert workload.meta["result_tokens"] == 2 * 4 * 500  # the last turn's call is never sent


@pytest.mark.parametrize(
    "options, message",
    [
        ({"vocab": 20000}, "vocab: 20000 is past the tokenizer's"),
        ({"result_median": 900, "result_max": 800}, "result_median: 900 is above result_max 800"),
        ({"result_sigma": -1.0}, "result_sigma: must be >= 0"),
        ({"tool_time_s": -0.5}, "tool_time_s: must be >= 0"),
        ({"turns": 0}, "turns"),
        ({"tokenizer": "/nonexistent/model"}, "tokenizer: cannot load a tokenizer from '/nonexistent/model'"),
    ],
)
def test_bad_options_name_themselves(options, message):
    given = {"tokenizer": str(DEMO), "num_sessions": 1, "turns": 2, "output_len": 4, "vocab": 1000} | options
    with pytest.raises(ValueError, match=message):
        build_workload("tool_agent", **given)


def test_loadtest_needs_the_tokenizer(tmp_path, capsys):
    args = ["loadtest", "--target", "grpc://127.0.0.1:1", "--workload", "tool_agent", "--out", str(tmp_path)]
    assert main(args) == 2
    assert "--tokenizer: required by --workload tool_agent" in capsys.readouterr().err
    assert main([*args, "--tokenizer", str(DEMO), "--result-max", "0", "--no-progress"]) == 2
    assert "--result-max: must be" in capsys.readouterr().err


def test_loadtest_drives_a_cluster_with_tool_calling_agents(
    loadtest_cluster, tiny_checkpoint, tmp_path, capsys
):
    out = tmp_path / "agents"
    status = main([
        "loadtest", "--target", f"grpc://127.0.0.1:{loadtest_cluster.port}", "--workload", "tool_agent",
        "--tokenizer", str(tiny_checkpoint("k3")), "--vocab", "200", "--sessions", "2", "--turns", "3",
        "--input-len", "8", "--result-median", "24", "--result-max", "48", "--output-len", "2",
        "--tool-time", "0.01", "--concurrency", "2", "--no-progress", "--out", str(out),
    ])  # fmt: skip
    assert status == 0, capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"]["completed"] == 6
    assert summary["cached_token_ratio"] > 0.3  # later turns and the second agent reuse the prefix
