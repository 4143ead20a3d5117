"""``baton bench spec``: plain, draft and self-draft arms side by side, each draft also under the adaptive
policy at the largest ``k``; the self-draft's acceptance is total and its tokens/s a real measurement;
the mean ``k`` per row; the CLI's table and JSON (printed and saved row by row), ``--no-adaptive``; bad
flags named."""

import json

from cli.main import main
from services.engine.benchmark import spec_bench
from services.engine.benchmark.spec_bench import (
    ADAPTIVE,
    DRAFT,
    PLAIN,
    SELF_ADAPTIVE,
    SELF_DRAFT,
    run_spec_bench,
    spec_arms,
)
from tests.engine.test_draft_model import draft_overrides


def test_arms_side_by_side_and_the_self_draft_accepts_everything(tiny_checkpoint):
    target, draft = tiny_checkpoint("k3"), tiny_checkpoint("k3", seed=1, **draft_overrides("k3"))
    arms = spec_arms(str(target), str(draft), [2], self_draft=True)
    assert [(a.name, a.num_draft_tokens, a.spec_policy) for a in arms] == [
        (PLAIN, 0, "fixed"),
        (DRAFT, 2, "fixed"),
        (SELF_DRAFT, 2, "fixed"),
        (ADAPTIVE, 2, "adaptive"),
        (SELF_ADAPTIVE, 2, "adaptive"),
    ]
    prompts = [list(range(3, 3 + n)) for n in (9, 14)]
    rows = run_spec_bench(
        str(target), arms, prompts, [1, 2], 6, 0.0, "cpu", repeats=1, dtype="float32", batch_invariant=True
    )
    assert [(r.arm, r.batch) for r in rows] == [(a.name, b) for a in arms for b in (1, 2)]
    for row in rows:
        assert row.decode_tokens_per_s > 0 and row.tpot_ms > 0
        if row.arm == PLAIN:
            assert row.speedup == 1.0 and row.accepted_per_verify is None and row.mean_draft_tokens is None
        else:
            assert 0 <= row.draft_time_share < 1 and len(row.acceptance_by_position) == 2
        if row.arm in (DRAFT, SELF_DRAFT):
            assert row.spec_policy == "fixed" and row.mean_draft_tokens == 2.0 and row.draft_time_share > 0
        if row.arm in (ADAPTIVE, SELF_ADAPTIVE):  # the CPU's times decide: 0 where it turned drafting off
            assert row.spec_policy == "adaptive" and 0 <= row.mean_draft_tokens <= 2
    for row in (r for r in rows if r.arm == SELF_DRAFT):
        assert row.accepted_per_verify == 2.0 and row.acceptance_by_position == (1.0, 1.0)


def test_cli_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "spec.json"
    argv = ["bench", "spec", "--batches", "1", "--decode-tokens", "3", "--prompt-len", "8"]
    argv += ["--num-draft-tokens", "2", "--repeats", "1", "--dtype", "float32", "--json", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("random weights: acceptance is meaningless")
    rows = json.loads(out.read_text())["rows"]
    assert [r["arm"] for r in rows] == [PLAIN, DRAFT, SELF_DRAFT, ADAPTIVE, SELF_ADAPTIVE]
    assert [r["spec_policy"] for r in rows] == [None, "fixed", "fixed", "adaptive", "adaptive"]
    assert all(0 <= r["mean_draft_tokens"] <= 2 for r in rows[1:])
    assert "mean k" in printed and "self-adaptive" in printed
    assert main([*argv, "--no-adaptive", "--no-self-draft"]) == 0
    assert [r["arm"] for r in json.loads(out.read_text())["rows"]] == [PLAIN, DRAFT]
    # Both KDA rollbacks side by side: the second's rows named after it, the same tokens accepted.
    assert main([*argv, "--no-adaptive", "--no-self-draft", "--kda-rollback", "states,replay"]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["arm"] for r in rows] == [PLAIN, DRAFT, f"{DRAFT}/replay"]
    assert rows[1]["acceptance_by_position"] == rows[2]["acceptance_by_position"]
    for bad, needle in (
        (["--batches", "0"], "--batches"),
        (["--num-draft-tokens", "x"], "--num-draft-tokens"),
        (["--temperature", "-1"], "--temperature"),
        (["--draft-model", str(tmp_path)], "--draft-model: needs --model"),
        (["--kda-rollback", "states,undo"], "--kda-rollback: undo unknown"),
    ):
        assert main(["bench", "spec", *bad]) == 2
        assert needle in capsys.readouterr().err


def test_rows_are_printed_and_saved_as_they_are_measured(tmp_path, capsys, monkeypatch):
    """A run stopped part-way (a device call's timeout sends SIGINT) keeps the rows it measured."""
    measure, calls = spec_bench._measure, []

    def measure_then_stop(*args, **kwargs):
        if calls:
            raise KeyboardInterrupt
        calls.append(1)
        return measure(*args, **kwargs)

    monkeypatch.setattr(spec_bench, "_measure", measure_then_stop)
    out = tmp_path / "spec.json"
    argv = ["bench", "spec", "--batches", "1", "--decode-tokens", "2", "--prompt-len", "8", "--repeats", "1"]
    assert main([*argv, "--num-draft-tokens", "2", "--dtype", "float32", "--json", str(out)]) == 130
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("arm") and lines[3].startswith(PLAIN)
    assert [r["arm"] for r in json.loads(out.read_text())["rows"]] == [PLAIN]
