"""``baton mismatch``: exit codes, ``--json``, bad files, and end to end on two ``baton generate`` runs."""

import json

import pytest

from cli.main import main
from mismatch import read_dump, write_dump
from tests.mismatch.dumps import environment, record


def _write(path, *records, **environment_changes):
    write_dump(path, environment(**environment_changes), records)
    return str(path)


def _mismatch(capsys, *args) -> tuple[int, str, str]:
    code = main(["mismatch", *args])
    out, err = capsys.readouterr()
    return code, out, err


CASES = {
    "equal": ({}, [-1.0, -2.0], {}, 0, "equal"),
    "values-differ": ({}, [-1.0, -2.5], {}, 1, "mismatch"),
    "environment": ({}, [-1.0, -2.0], {"kernels": "triton"}, 4, "environment_mismatch"),
    "vacuous-mode": ({"numerics": "default"}, [-1.0, -2.0], {"numerics": "default"}, 3, "vacuous"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_exit_codes_and_json(case, tmp_path, capsys):
    env_a, values_b, env_b, code, status = CASES[case]
    a = _write(tmp_path / "a.jsonl", record("r", [-1.0, -2.0]), **env_a)
    b = _write(tmp_path / "b.jsonl", record("r", values_b), **env_b)
    mode = ["--mode", "inference"] if case == "vacuous-mode" else []
    got, out, _ = _mismatch(capsys, a, b, "--json", *mode)
    report = json.loads(out)
    assert got == code and report["status"] == status
    for key in ("compared_tokens", "bitwise_equal", "mismatched", "vacuous", "first_divergence"):
        assert key in report
    for key in ("max_abs_diff", "environment_diff", "missing"):
        assert key in report
    human_code, text, _ = _mismatch(capsys, a, b, *mode)
    assert human_code == code and text.strip().splitlines()[-1].startswith("result: ")


def test_bad_file_is_a_cli_error_naming_file_line_and_field(tmp_path, capsys):
    good = _write(tmp_path / "a.jsonl", record("r", [-1.0]))
    bad = tmp_path / "b.jsonl"
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    bad.write_text(lines[0] + "\n" + lines[1].replace('"token_ids"', '"tokens"') + "\n")
    code, out, err = _mismatch(capsys, good, str(bad))
    assert code == 2 and out == ""
    assert f"baton mismatch: error: {bad} line 2: token_ids: missing" in err and "Traceback" not in err
    code, _, err = _mismatch(capsys, good, str(tmp_path / "absent.jsonl"))
    assert code == 2 and "absent.jsonl: cannot read" in err


def _generate(model, prompts: list[tuple[str, list[int]]], out, *flags) -> None:
    source = out.with_suffix(".in.jsonl")
    source.write_text("".join(json.dumps({"id": i, "prompt_ids": p}) + "\n" for i, p in prompts))
    args = ["generate", "--model", str(model), "--prompts", str(source), "--out", str(out)]
    assert main([*args, "--max-tokens", "6", "--ignore-eos", "--logprobs", *flags]) == 0


def test_generate_alone_and_among_others_is_bitwise_equal_end_to_end(tiny_checkpoint, tmp_path, capsys):
    model = tiny_checkpoint("k3")
    target = ("t", [3, 4, 5, 6, 7])
    others = [("o1", [9, 8, 7, 6, 5, 4, 3, 2, 1, 9, 8]), ("o2", [11, 12])]
    alone, among = tmp_path / "alone.jsonl", tmp_path / "among.jsonl"
    _generate(model, [target], alone, "--batch-invariant")
    _generate(
        model, [others[0], target, others[1]], among, "--batch-invariant", "--max-num-batched-tokens", "8"
    )
    assert read_dump(alone).environment.numerics == "batch_invariant"
    code, out, _ = _mismatch(capsys, str(alone), str(among), "--mode", "inference", "--json")
    report = json.loads(out)
    assert code == 0, report
    assert report["vacuous"] is False and report["compared_tokens"] == 6 and report["bitwise_equal"] == 6
    assert report["environment_diff"]["flags.max_num_batched_tokens"]["allowed"] is True
    assert report["missing"] == {"from_a": ["o1", "o2"], "from_b": []}

    default_a, default_b = tmp_path / "default_a.jsonl", tmp_path / "default_b.jsonl"
    _generate(model, [target], default_a)
    _generate(model, [others[0], target], default_b)
    code, out, _ = _mismatch(capsys, str(default_a), str(default_b), "--mode", "inference")
    assert code == 3 and "VACUOUS (dump A ran default numerics; inference tests batch_invariant)" in out
    code, out, _ = _mismatch(capsys, str(alone), str(default_a), "--json")
    assert code == 4 and json.loads(out)["environment_diff"]["numerics"]["allowed"] is False
