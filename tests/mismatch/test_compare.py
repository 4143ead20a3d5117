"""Bitwise comparison semantics, the experiment modes and the verdict's order of checks."""

import pytest

from mismatch import MODES, LogprobRecord, compare_dumps, judge
from mismatch.report import to_json, to_text
from tests.mismatch.dumps import dump, record

FILES = ("a.jsonl", "b.jsonl")


def _one(a: LogprobRecord, b: LogprobRecord):
    comparison = compare_dumps(dump(a), dump(b))
    (sequence,) = comparison.sequences
    return comparison, sequence


def test_identical_dumps_are_equal_and_not_vacuous():
    comparison, sequence = _one(record("r", [-1.0, -0.5]), record("r", [-1.0, -0.5]))
    assert (comparison.compared_tokens, comparison.bitwise_equal, comparison.mismatched) == (2, 2, 0)
    assert not comparison.vacuous and comparison.first_divergence == {} and sequence.reason is None


def test_plus_and_minus_zero_differ():
    comparison, sequence = _one(record("r", [-1.0, 0.0]), record("r", [-1.0, -0.0]))
    assert comparison.mismatched == 1 and comparison.first_divergence == {"r": 1}
    assert sequence.reason == "logprob" and comparison.max_abs_diff == 0.0  # equal as floats, not as bits


def test_nan_payloads_are_compared_as_bits():
    same = _one(
        LogprobRecord.from_bits("r", "generate", [1], [0x7FC00001], "float32"),
        LogprobRecord.from_bits("r", "generate", [1], [0x7FC00001], "float32"),
    )[0]
    assert same.bitwise_equal == 1 and same.mismatched == 0
    other = _one(
        LogprobRecord.from_bits("r", "generate", [1], [0x7FC00001], "float32"),
        LogprobRecord.from_bits("r", "generate", [1], [0x7FC00002], "float32"),
    )[0]
    assert other.mismatched == 1 and other.nonfinite_mismatches == 1 and other.max_abs_diff == 0.0


def test_equal_floats_of_different_dtypes_differ():
    comparison, sequence = _one(record("r", [-1.0, -2.0]), record("r", [-1.0, -2.0], dtype="bfloat16"))
    assert comparison.mismatched == 2 and comparison.bitwise_equal == 0
    assert sequence.reason == "dtype" and sequence.first_divergence == 0 and comparison.max_abs_diff == 0.0


def test_first_divergence_per_sequence_and_max_delta():
    a = dump(record("x", [-1.0, -2.0, -3.0, -4.0]), record("y", [-1.0, -2.0]), record("z", [-1.0]))
    b = dump(record("x", [-1.0, -2.0, -3.5, -4.25]), record("y", [-1.0, -2.0]), record("z", [-0.75]))
    comparison = compare_dumps(a, b)
    assert comparison.first_divergence == {"x": 2, "z": 0}
    assert (comparison.compared_tokens, comparison.bitwise_equal, comparison.mismatched) == (7, 4, 3)
    assert comparison.max_abs_diff == 0.5


def test_a_token_difference_stops_the_sequence_there():
    comparison, sequence = _one(
        record("r", [-1.0, -2.0, -3.0, -4.0], tokens=[5, 6, 7, 8]),
        record("r", [-1.0, -2.0, -3.0, -4.0], tokens=[5, 6, 9, 8]),
    )
    assert sequence.first_divergence == 2 and sequence.reason == "token"
    assert (sequence.compared, sequence.equal, sequence.skipped) == (3, 2, 1)


def test_a_longer_sequence_diverges_where_the_shorter_ends():
    _, sequence = _one(record("r", [-1.0, -2.0, -3.0]), record("r", [-1.0]))
    assert (sequence.first_divergence, sequence.reason, sequence.compared, sequence.skipped) == (
        1,
        "length",
        2,
        1,
    )


def test_different_prompts_diverge_at_zero():
    _, sequence = _one(record("r", [-1.0], prompt_ids=[1, 2]), record("r", [-1.0], prompt_ids=[1, 3]))
    assert (sequence.first_divergence, sequence.reason) == (0, "prompt")


def test_a_position_counts_only_where_both_masks_allow_it():
    comparison, sequence = _one(
        record("r", [-1.0, -9.0, -3.0, -9.0], mask=[1, 0, 1, 1]),
        record("r", [-1.0, -2.0, -3.0, -4.0], mask=[1, 1, 1, 0]),
    )
    assert (sequence.compared, sequence.equal, sequence.masked_out) == (2, 2, 2)
    assert comparison.mask == "A and B" and comparison.mismatched == 0
    one_sided = compare_dumps(dump(record("r", [-1.0, -2.0])), dump(record("r", [-1.0, -5.0], mask=[1, 0])))
    assert one_sided.mask == "B" and one_sided.compared_tokens == 1 and one_sided.mismatched == 0


def test_missing_ids_are_listed_and_fail_only_when_required():
    a = dump(record("both", [-1.0]), record("only-a", [-1.0]))
    b = dump(record("only-b", [-1.0]), record("both", [-1.0]))
    comparison = compare_dumps(a, b)
    assert comparison.missing_from_a == ("only-b",) and comparison.missing_from_b == ("only-a",)
    assert judge(MODES["general"], a, b, FILES).status == "equal"
    strict = judge(MODES["general"], a, b, FILES, require_all=True)
    assert strict.status == "mismatch" and strict.exit_code == 1
    assert to_json(strict)["missing"] == {"from_a": ["only-b"], "from_b": ["only-a"]}


VACUOUS = {
    "no-common-id": (dump(record("a", [-1.0])), dump(record("b", [-1.0])), "no request id is in both dumps"),
    "all-masked": (
        dump(record("a", [-1.0, -2.0], mask=[0, 0])),
        dump(record("a", [-1.0, -7.0])),
        "every position is masked out",
    ),
    "no-logprobs": (
        dump(LogprobRecord("a", "generate", (1, 2))),
        dump(record("a", [-1.0, -2.0])),
        "no common request has log-probs on both sides",
    ),
    "empty": (dump(), dump(), "no request id is in both dumps"),
}


@pytest.mark.parametrize("case", list(VACUOUS), ids=list(VACUOUS))
def test_nothing_compared_is_vacuous_not_a_pass(case):
    a, b, reason = VACUOUS[case]
    verdict = judge(MODES["general"], a, b, FILES)
    assert verdict.status == "vacuous" and verdict.exit_code == 3 and verdict.vacuous_reason == reason
    assert to_json(verdict)["vacuous"] is True and "VACUOUS" in to_text(verdict)


def test_the_environment_is_compared_first():
    a = dump(record("r", [-1.0]), device="NVIDIA H200")
    b = dump(record("r", [-9.0]), device="cpu: test", libraries={"torch": "2.12.0", "fla": "0.6.0"})
    verdict = judge(MODES["general"], a, b, FILES)
    assert verdict.status == "environment_mismatch" and verdict.exit_code == 4
    assert verdict.comparison is None  # no token was compared
    report = to_json(verdict)
    assert report["environment_diff"] == {
        "libraries.torch": {"a": "2.13.0", "b": "2.12.0", "allowed": False},
        "device": {"a": "NVIDIA H200", "b": "cpu: test", "allowed": False},
    }
    assert report["compared_tokens"] == 0 and report["vacuous"] is False
    assert "ENVIRONMENT MISMATCH (libraries.torch, device)" in to_text(verdict)
    varied = judge(MODES["general"], a, b, FILES, vary=("device", "libraries"))
    assert varied.status == "mismatch" and to_json(varied)["environment_diff"]["device"]["allowed"] is True


def test_a_mode_allows_the_fields_its_experiment_varies():
    a = dump(record("r", [-1.0]), flags={"max_num_seqs": 1})
    b = dump(record("r", [-1.0]), flags={"max_num_seqs": 8, "chunk": 64})
    assert judge(MODES["general"], a, b, FILES).status == "environment_mismatch"
    assert judge(MODES["inference"], a, b, FILES).status == "equal"
    assert judge(MODES["general"], a, b, FILES, vary=("flags.max_num_seqs", "flags.chunk")).status == "equal"
    kv = dump(record("r", [-1.0], path="trainer"), kv_format=None)
    assert judge(MODES["rollout"], a, kv, FILES).status == "equal"
    assert judge(MODES["rollout"], kv, a, FILES).status == "equal"  # either order
    assert judge(MODES["training"], kv, kv, FILES).status == "equal"


@pytest.mark.parametrize("mode", ["inference", "training", "rollout", "scorer"])
def test_default_numerics_means_the_path_under_test_did_not_run(mode):
    a = dump(record("r", [-1.0]), numerics="default")
    verdict = judge(MODES[mode], a, a, FILES)
    assert verdict.status == "vacuous" and "dump A ran default numerics" in verdict.vacuous_reason
    assert judge(MODES["general"], a, a, FILES).status == "equal"


@pytest.mark.parametrize(
    "mode, paths, ok",
    [
        ("inference", ("generate", "score"), True),
        ("inference", ("generate", "trainer"), False),
        ("training", ("trainer", "trainer"), True),
        ("training", ("generate", "trainer"), False),
        ("rollout", ("generate", "trainer"), True),
        ("rollout", ("generate", "generate"), False),
        ("scorer", ("generate", "score"), True),
        ("scorer", ("score", "trainer"), False),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, tuple) else str(v),
)
def test_each_mode_checks_which_paths_produced_the_dumps(mode, paths, ok):
    a = dump(record("r", [-1.0], path=paths[0]))
    b = dump(record("r", [-1.0], path=paths[1]), kv_format=None if paths[1] == "trainer" else "auto")
    verdict = judge(MODES[mode], a, b, FILES, vary=("kv_format",))
    assert verdict.status == ("equal" if ok else "vacuous")
    if not ok:
        assert f"{mode} compares A from" in verdict.vacuous_reason


def test_json_keys_and_the_human_report():
    a = dump(record(1, [-1.0, -2.0]), record("y", [-1.0]))
    b = dump(record(1, [-1.0, -2.5]), record("z", [-1.0]))
    verdict = judge(MODES["general"], a, b, FILES)
    report = to_json(verdict)
    for key in ("compared_tokens", "bitwise_equal", "mismatched", "vacuous", "first_divergence"):
        assert key in report
    assert report["first_divergence"] == {"1": 1} and report["max_abs_diff"] == 0.5
    assert (report["status"], verdict.exit_code, report["mask"]) == ("mismatch", 1, "none")
    text = to_text(verdict)
    for line in ("compared tokens: 2", "bitwise equal: 1", "mismatched: 1", "max |delta|: 0.5"):
        assert line in text
    assert "1: first divergence at position 1 (logprob)" in text and "missing from A: 'z'" in text
