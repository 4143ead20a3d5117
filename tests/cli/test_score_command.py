"""``baton score``: plain JSONL input (ids, prompts, tokens to score), the dump it writes, and bad input
named by file, line and field before any model is built. The dump-input path and the scorer experiment
(``baton mismatch --mode scorer``) run in ``tests/trainer/test_rollout_end_to_end.py``."""

import json

import pytest

from cli.main import main
from mismatch import read_dump
from services.engine import LLM, SamplingParams
from tests.conftest import TEST_DEVICE


def test_scores_plain_jsonl_as_generation_reported(tiny_checkpoint, tmp_path):
    model = tiny_checkpoint("kimi_linear")
    prompt = [3, 4, 5, 6, 7]
    llm = LLM(str(model), device=TEST_DEVICE, batch_invariant=True, dtype="float32")
    served = llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0, logprobs=0, ignore_eos=True))[
        0
    ]
    source, out = tmp_path / "in.jsonl", tmp_path / "score.jsonl"
    lines = [
        {"id": "x", "prompt_ids": prompt, "token_ids": served.token_ids},
        {"prompt_ids": [9], "token_ids": []},
    ]
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    args = ["score", "--model", str(model), "--prompts", str(source), "--out", str(out)]
    assert main([*args, "--batch-invariant", "--dtype", "float32", "--device", TEST_DEVICE]) == 0
    dump = read_dump(out)
    assert dump.environment.numerics == "batch_invariant"
    first, second = dump.records
    assert (first.request_id, first.path, list(first.token_ids)) == ("x", "score", served.token_ids)
    assert first.logprobs == tuple(served.logprobs), "scored in one prefill: the generated bits"
    assert (second.request_id, second.token_ids, second.logprobs) == (2, (), ())


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"id": 1, "token_ids": [1]}', "line 1: prompt_ids must be a non-empty list of integers"),
        ('{"prompt_ids": [1], "token_ids": [true]}', "line 1: token_ids must be a list of integers"),
        ('{"prompt_ids": [1], "token_ids": [], "adapter": 3}', "line 1: adapter must be a string"),
        ("[1, 2", "line 1: not valid JSON"),
    ],
    ids=["no-prompt", "bool-token", "adapter-not-a-string", "bad-json"],
)
def test_bad_input_names_the_line_and_field(line, message, tmp_path, capsys):
    source = tmp_path / "in.jsonl"
    source.write_text(line + "\n")
    code = main(["score", "--model", str(tmp_path), "--prompts", str(source), "--out", str(tmp_path / "o")])
    assert code == 2 and f"baton score: error: --prompts: in.jsonl {message}" in capsys.readouterr().err
