"""Dump format: values round-trip bitwise in their dtype, bad input is refused naming file, line and
field, and the package loads without torch."""

import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from mismatch import DumpError, LogprobRecord, read_dump, write_dump
from mismatch import bits as b
from tests.mismatch.dumps import environment, record

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "dtype, value, hex_form",
    [
        ("float32", -1.0, "bf800000"),
        ("float32", 0.0, "00000000"),
        ("float32", -0.0, "80000000"),
        ("float32", -math.inf, "ff800000"),
        ("bfloat16", -1.0, "bf80"),
        ("bfloat16", -0.0, "8000"),
        ("float16", -0.5, "b800"),
        ("float64", -0.1, "bfb999999999999a"),
    ],
    ids=[
        "f32-minus-one",
        "f32-plus-zero",
        "f32-minus-zero",
        "f32-minus-inf",
        "bf16-minus-one",
        "bf16-minus-zero",
        "f16-minus-half",
        "f64-minus-tenth",
    ],
)
def test_bits_are_the_dtypes_bytes(dtype, value, hex_form):
    pattern = b.to_bits(value, dtype)
    assert b.to_hex(pattern, dtype) == hex_form
    assert b.from_hex(hex_form, dtype) == pattern
    back = b.from_bits(pattern, dtype)
    assert back == value and math.copysign(1, back) == math.copysign(1, value)


@pytest.mark.parametrize(
    "dtype, value",
    [
        ("float32", 0.1),
        ("bfloat16", struct.unpack(">f", struct.pack(">I", 0x3F800001))[0]),
        ("float16", 1e-8),
    ],
    ids=["f32-would-round", "bf16-low-bits-set", "f16-would-round"],
)
def test_a_value_not_of_the_dtype_is_refused(dtype, value):
    with pytest.raises(ValueError, match="is not a"):
        b.to_bits(value, dtype)


@pytest.mark.parametrize("text", ["3f80000", "3F800000", "+3f80000", "3f_80000", " 3f80000"])
def test_hex_must_be_fixed_width_lowercase(text):
    with pytest.raises(ValueError, match="8 lowercase hex digits"):
        b.from_hex(text, "float32")


def test_round_trip_keeps_every_bit(tmp_path):
    quiet_nan, payload_nan = 0x7FC00000, 0x7FC00123
    records = [
        record("zeros", [0.0, -0.0, -math.inf, -1.5]),
        LogprobRecord.from_bits(7, "trainer", [1, 2, 3], [quiet_nan, payload_nan, -1082130432], "float32"),
        record("bf16", [-0.0, -2.0], dtype="bfloat16", mask=[True, False], prompt_ids=[4, 5]),
        record("extra", [-0.25], extra={"text": "hi", "finish_reason": "length"}),
        LogprobRecord("none", "generate", (1, 2)),
    ]
    path = tmp_path / "d.jsonl"
    assert write_dump(path, environment(), records) == 5
    dump = read_dump(path)
    assert dump.environment == environment()
    assert dump.records == tuple(records)
    assert dump.records[1].logprob_bits == (quiet_nan, payload_nan, 0xBF800000)  # signed view normalized
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["baton_logprob_dump"] == 1
    zeros = json.loads(lines[1])
    assert zeros["logprob_bits"] == ["00000000", "80000000", "ff800000", "bfc00000"]
    assert zeros["logprobs"][2] is None  # not finite: JSON has no -Infinity
    assert str(zeros["logprobs"][1]) == "-0.0"


def test_a_record_of_floats_alone_is_encoded_exactly(tmp_path):
    path = tmp_path / "hand.jsonl"
    header = {"baton_logprob_dump": 1, "environment": environment().to_json()}
    line = {"id": "x", "path": "trainer", "token_ids": [1, 2], "dtype": "float32", "logprobs": [-0.0, -0.5]}
    path.write_text(json.dumps(header) + "\n" + json.dumps(line) + "\n")
    (only,) = read_dump(path).records
    assert only.logprob_bits == (0x80000000, 0xBF000000)


HEADER = json.dumps({"baton_logprob_dump": 1, "environment": environment().to_json()})
GOOD = {
    "id": "a",
    "path": "generate",
    "token_ids": [1, 2],
    "dtype": "float32",
    "logprob_bits": ["bf800000"] * 2,
}
BAD_INPUT = {
    "no-header": ([json.dumps(GOOD)], "line 1: baton_logprob_dump: missing"),
    "old-generate-out": (['{"id": "a", "token_ids": [1], "logprobs": [-1.0]}'], "line 1: baton_logprob_dump"),
    "version": (['{"baton_logprob_dump": 2, "environment": {}}'], "line 1: baton_logprob_dump: version 2"),
    "env-field": (
        [
            json.dumps(
                {"baton_logprob_dump": 1, "environment": {**environment().to_json(), "numerics": "fast"}}
            )
        ],
        "line 1: environment.numerics: 'fast' is not one of",
    ),
    "env-missing": (
        ['{"baton_logprob_dump": 1, "environment": {"python": "3"}}'],
        "line 1: environment.platform",
    ),
    "no-environment": (['{"baton_logprob_dump": 1}'], "line 1: environment: expected an object, got None"),
    "bad-json": ([HEADER, json.dumps(GOOD), '{"id": '], "line 3: not valid JSON"),
    "no-token-ids": ([HEADER, json.dumps({"id": "a", "path": "generate"})], "line 2: token_ids: missing"),
    "bad-path": ([HEADER, json.dumps({**GOOD, "path": "served"})], "line 2: path: 'served' is not one of"),
    "bad-dtype": ([HEADER, json.dumps({**GOOD, "dtype": "fp8"})], "line 2: dtype: 'fp8' is not one of"),
    "no-dtype": ([HEADER, json.dumps({**GOOD, "dtype": None})], "line 2: dtype: missing"),
    "short-hex": (
        [HEADER, json.dumps({**GOOD, "logprob_bits": ["bf800000", "bf80"]})],
        "line 2: logprob_bits[1]: expected 8 lowercase hex digits",
    ),
    "count": (
        [HEADER, json.dumps({**GOOD, "logprob_bits": ["bf800000"]})],
        "line 2: logprob_bits: 1 entries",
    ),
    "copy-disagrees": (
        [HEADER, json.dumps({**GOOD, "logprobs": [-1.0, 0.0]})],
        "line 2: logprobs[1]: 0.0 disagrees with logprob_bits[1]",
    ),
    "copy-sign": (
        [HEADER, json.dumps({**GOOD, "logprob_bits": ["80000000"] * 2, "logprobs": [-0.0, 0.0]})],
        "line 2: logprobs[1]: 0.0 disagrees",
    ),
    "float-rounds": (
        [HEADER, json.dumps({**GOOD, "logprob_bits": None, "logprobs": [-0.1, -1.0]})],
        "line 2: logprobs[0]: -0.1 is not a float32 value",
    ),
    "mask": ([HEADER, json.dumps({**GOOD, "mask": [1, 2]})], "line 2: mask: expected a list of 0 and 1"),
    "mask-length": ([HEADER, json.dumps({**GOOD, "mask": [1]})], "line 2: mask: 1 entries for 2 token_ids"),
    "token-ids": (
        [HEADER, json.dumps({**GOOD, "token_ids": [1, "2"]})],
        "line 2: token_ids: expected a list",
    ),
    "duplicate": ([HEADER, json.dumps(GOOD), "", json.dumps(GOOD)], "line 4: id: 'a' repeats line 2"),
    "empty": ([""], "empty"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT), ids=list(BAD_INPUT))
def test_bad_input_names_file_line_and_field(case, tmp_path):
    lines, message = BAD_INPUT[case]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DumpError) as caught:
        read_dump(path)
    assert str(caught.value).startswith(str(path)) and message in str(caught.value)


def test_writer_refuses_repeated_ids_and_clashing_extras(tmp_path):
    with pytest.raises(DumpError, match="'a' is written twice"):
        write_dump(tmp_path / "d.jsonl", environment(), [record("a", [-1.0]), record("a", [-2.0])])
    with pytest.raises(DumpError, match="mask: an extra field may not reuse a schema key"):
        record("a", [-1.0], extra={"mask": [1]})
    with pytest.raises(DumpError, match=r"logprobs\[0\]: 0.1 is not a float32 value"):
        record("a", [0.1])


def test_the_package_loads_without_torch():
    probe = "import json, sys, mismatch, mismatch.report; print(json.dumps('torch' in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert json.loads(result.stdout) is False
