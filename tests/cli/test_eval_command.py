"""``baton eval`` on a tiny k3 checkpoint (random weights, tiny tokenizer): the perplexity is the one
``LLM.score``'s log-probs give, recomputed here; served vs offline, FP8 KV error and DSA overlap are
reported with values that show their paths ran; bad flags are named."""

import json
import math

import pytest

from cli.eval_command import served_vs_offline
from cli.main import main
from common.tokenizer import Tokenizer
from services.engine import LLM

TEXT = (
    "In the beginning the Lord made the heaven and the earth. And the earth was waste and without form; "
    "and it was dark on the face of the deep: and the Spirit of God was moving on the face of the waters. "
    "And God said, Let there be light: and there was light. And God, looking on the light, saw that it "
    "was good: and God made a division between the light and the dark, naming the light, Day, and the "
    "dark, Night. And there was evening and there was morning, the first day. "
)
SEQ_LEN = 40


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("eval") / "text.txt"
    path.write_text(TEXT * 3)
    return path


def test_reports_perplexity_agreement_fp8_error_and_overlap(tiny_checkpoint, text_file, tmp_path, capsys):
    model, draft = tiny_checkpoint("k3"), tiny_checkpoint("k3", seed=1)
    out = tmp_path / "eval.json"
    flags = ["--seq-len", str(SEQ_LEN), "--max-windows", "3", "--kv-windows", "2", "--prompts", "2"]
    flags += ["--prompt-len", "8", "--max-tokens", "6", "--dtype", "float32", "--draft-tokens", "1,3"]
    argv = ["eval", "--model", str(model), "--draft", str(draft), "--text", str(text_file), *flags]
    assert main([*argv, "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert {"perplexity", "served_vs_offline", "kv_fp8", "dsa_overlap", "draft_acceptance"} <= set(results)

    ids = Tokenizer.from_pretrained(model).encode(text_file.read_text())
    windows = [ids[s : s + SEQ_LEN] for s in range(0, len(ids) - SEQ_LEN + 1, SEQ_LEN)][:3]
    assert results["windows"] == len(windows) == 3
    for folder, name in ((model, "model"), (draft, "draft")):
        logprobs = LLM(str(folder), dtype="float32").score([w[:1] for w in windows], [w[1:] for w in windows])
        values = [v for row in logprobs for v in row]
        assert len(values) == results["scored_tokens"] == 3 * (SEQ_LEN - 1)
        assert results["perplexity"][name] == pytest.approx(
            math.exp(-math.fsum(values) / len(values)), rel=1e-9
        )
    assert results["perplexity"]["model"] != results["perplexity"]["draft"]

    served = results["served_vs_offline"]
    assert served["kernels"] == ["reference", "reference"] and served["tokens"] == 2 * 6
    assert served["token_agreement"] == 1.0 and served["identical_prefix_mean"] == 6.0
    assert served["max_logprob_diff"] < 1e-4  # decode steps on paged blocks vs one prefill: same model

    kv = results["kv_fp8"]
    assert kv["tokens"] == 2 * SEQ_LEN
    assert 0 < kv["next_token_logprob_abs_diff_mean"] < 0.5  # the FP8 path ran, and stays close
    assert kv["next_token_logprob_abs_diff_max"] >= kv["next_token_logprob_abs_diff_mean"]
    assert 0.5 < results["dsa_overlap"] <= 1.0  # windows of 40 > tiny index_topk 16: a real selection
    assert results["dsa_overlap"] == kv["indexer_overlap"]

    printed = capsys.readouterr().out
    assert "perplexity (draft)" in printed and "DSA top-k overlap" in printed
    acceptance = results["draft_acceptance"]
    assert list(acceptance) == ["1", "3"]
    for k, row in acceptance.items():
        assert row["same_tokens"] and row["verifies"] > 0 and 0 <= row["accepted_per_verify"] <= int(k)
        assert f"draft accepted per verify (k={k})" in printed


def test_default_text_is_the_heldout_corpus_and_short_windows_select_every_key(tiny_checkpoint, tmp_path):
    out = tmp_path / "eval.json"
    flags = [
        "--seq-len",
        "16",
        "--max-windows",
        "1",
        "--kv-windows",
        "1",
        "--prompts",
        "1",
        "--prompt-len",
        "4",
        "--max-tokens",
        "2",
    ]
    assert main(["eval", "--model", str(tiny_checkpoint("k3")), *flags, "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["text"] == "heldout_documents()" and results["windows"] == 1
    assert results["dsa_overlap"] == "--seq-len 16 <= index_topk 16: every key is selected"


def test_served_triton_kernels_against_the_reference_engine(tiny_checkpoint):
    """With ``--kernels triton`` the offline side is a second engine on the reference kernels: the
    log-probs differ by rounding only (nonzero: two kernel sets really ran), the greedy tokens agree."""
    model = str(tiny_checkpoint("k3"))
    served = LLM(model, kernels="triton", dtype="float32")
    reference = LLM(model, kernels="reference", dtype="float32")
    report = served_vs_offline(served, reference, [[5, 6, 7, 8, 9, 10]], max_tokens=3)
    assert report["kernels"] == ["triton", "reference"] and report["tokens"] == 3
    assert report["token_agreement"] == 1.0
    assert 0 < report["max_logprob_diff"] < 1e-4


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--seq-len", "1"], "--seq-len: 1 must be at least 2"),
        (["--max-windows", "0"], "--max-windows: 0 must be at least 1"),
        (["--kv-windows", "0"], "--kv-windows: 0 must be at least 1"),
        (["--prompts", "0"], "--prompts: 0 must be at least 1"),
        (["--max-tokens", "0"], "--max-tokens: 0 must be at least 1"),
        (["--seq-len", "8", "--prompt-len", "8"], "--prompt-len: 8 must be below --seq-len 8"),
        (["--text", "missing.txt"], "--text: missing.txt not found"),
        (["--draft", "missing"], "--draft: missing is not a checkpoint folder"),
        (["--seq-len", "64", "--max-model-len", "32"], "--seq-len: 64 exceeds --max-model-len 32"),
        (["--seq-len", "4000"], "--seq-len: no document holds 4000 tokens"),
    ],
    ids=[
        "seq-len",
        "max-windows",
        "kv-windows",
        "prompts",
        "max-tokens",
        "prompt-len",
        "text",
        "draft",
        "max-model-len",
        "text-too-short",
    ],
)
def test_bad_flags_exit_2_naming_the_flag(flags, message, tiny_checkpoint, text_file, capsys):
    argv = ["eval", "--model", str(tiny_checkpoint("k3")), "--text", str(text_file), *flags]
    if "--text" in flags:
        argv = argv[:3] + argv[5:]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
