"""Capacity ledgers and fits, checked against hand computations from the config numbers, and the
``baton capacity`` command run as a real subprocess on a folder holding only ``config.json``."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cli.main import main as baton_main
from services.engine.capacity import (
    CapacityLedger,
    capacity_ledger,
    fit,
    format_bytes,
    ledger_dict,
)
from services.engine.checkpoint.loader import load_model
from services.engine.checkpoint.presets import preset_config, with_layers
from services.engine.checkpoint.random_init import write_random_checkpoint
from services.engine.model.causal_lm import CausalLM
from services.engine.model.config_loader import load_model_config
from services.engine.parallel.context import ParallelContext
from services.engine.parallel.layout import ParallelLayout

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def tiny(family: str, **overrides):
    return load_model_config({**preset_config(family, "tiny"), **overrides})


def ledger(family: str = "k3", dtype=torch.float32, **kwargs) -> CapacityLedger:
    options = dict(block_size=16, kv_format="auto", batch_invariant=False, max_num_batched_tokens=8192)
    options.update(kwargs)
    config = family if not isinstance(family, str) else tiny(family)
    return capacity_ledger(config, dtype, **options)


# DeepSeek-V3.2 at its released sizes (config.json of deepseek-ai/DeepSeek-V3.2-Exp).
DEEPSEEK_V32 = {
    "model_type": "deepseek_v32",
    "vocab_size": 129280,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 8,
    "topk_group": 4,
    "first_k_dense_replace": 3,
    "routed_scaling_factor": 2.5,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "index_topk": 2048,
    "rope_theta": 10000,
    "rope_scaling": {
        "type": "yarn",
        "factor": 40,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "torch_dtype": "bfloat16",
}

# A K3-like hybrid at Kimi-Linear-48B sizes (3 KDA : 1 MLA, 27 layers) with a DSA indexer.
K3_LIKE = {
    "model_type": "kimi_linear",
    "vocab_size": 163840,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "moe_intermediate_size": 1024,
    "num_hidden_layers": 27,
    "num_attention_heads": 32,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_experts": 256,
    "num_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 1,
    "linear_attn_config": {
        "head_dim": 128,
        "num_heads": 32,
        "short_conv_kernel_size": 4,
        "kda_layers": [i for i in range(1, 28) if i % 4],
        "full_attn_layers": [i for i in range(1, 28) if i % 4 == 0],
    },
    "index_n_heads": 32,
    "index_head_dim": 128,
    "index_topk": 2048,
    "torch_dtype": "bfloat16",
}


# ---- persistent state -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_k3_tiny_kv_bytes_per_token_from_config_numbers(dtype):
    # One MLA layer (layer 3); latent kv_lora_rank 32, rope 8, index key 16 channels per token.
    got = ledger("k3", dtype)
    size = dtype.itemsize
    assert got.mla_layers == 1 and got.kda_layers == 3
    assert got.kv_by_kind == (("latent", 32 * size), ("k_rope", 8 * size), ("index_key", 16 * size))
    assert got.kv_bytes_per_token == (32 + 8 + 16) * size
    assert got.kv_block_bytes == 16 * (32 + 8 + 16) * size


def test_kda_slot_bytes_from_config_numbers():
    # Three KDA layers: H=4 heads of dk=dv=16 -> fp32 state 4*16*16*4 = 4096 B; the short-conv tail
    # keeps kernel-1 = 3 columns of the fused q/k/v width 3*4*16 = 192 -> 192*3*4 = 2304 B.
    assert ledger("k3").kda_slot_bytes == 3 * (4096 + 2304)
    # CF-BI adds C = 16 rows of keys, decays and deltas [16, 4, 16] fp32 (4096 B each) and an int32
    # count, padded to 64 bytes.
    assert ledger("k3", batch_invariant=True).kda_slot_bytes == 3 * (4096 + 2304 + 3 * 4096 + 64)


def test_deepseek_has_no_kda_state_and_kimi_no_index_keys():
    deepseek, kimi = ledger("deepseek_v32"), ledger("kimi_linear")
    assert deepseek.kda_layers == 0 and deepseek.kda_slot_bytes == 0 and deepseek.kda_by_kind == ()
    assert deepseek.kv_bytes_per_token == 4 * (32 + 8 + 16) * 4  # four MLA layers, all indexed
    result = fit(deepseek, GIB, 4096)
    assert result.kda_slots == 0 and result.kda_bytes == 0 and result.limiting == "kv"
    assert [kind for kind, _ in kimi.kv_by_kind] == ["latent", "k_rope"]
    assert kimi.kv_bytes_per_token == (32 + 8) * 4


@pytest.mark.parametrize("family", ["k3", "kimi_linear", "deepseek_v32"])
def test_weight_bytes_equal_a_loaded_model(family, tmp_path):
    # A real checkpoint loaded in bf16: routers, score biases, dt_bias and weights_proj stay float32.
    write_random_checkpoint(tmp_path, preset_config(family, "tiny"), seed=0)
    model = load_model(tmp_path, dtype=torch.bfloat16)
    params = list(model.parameters())
    assert {p.dtype for p in params} == {torch.bfloat16, torch.float32}
    got = ledger(family, torch.bfloat16)
    assert got.weight_bytes == sum(p.numel() * p.element_size() for p in params)
    assert got.float32_weight_bytes == sum(p.numel() * 4 for p in params if p.dtype == torch.float32)
    assert got.num_parameters == sum(p.numel() for p in params)


def test_tied_embeddings_are_counted_once():
    config = tiny("k3", tie_word_embeddings=True)
    model = CausalLM(config)  # float32 throughout
    assert ledger(config).weight_bytes == sum(p.numel() * 4 for p in model.parameters())
    assert ledger(config).weight_bytes == ledger("k3").weight_bytes - 1024 * 64 * 4


def test_fp8_kv_per_token_of_full_size_deepseek_v32():
    config = load_model_config(DEEPSEEK_V32)
    got = capacity_ledger(config, torch.bfloat16, 64, "fp8", False, 8192)
    # Latent: 512 fp8 + 4 float32 scales + 64 bf16 rope = 656 B; index key: 128 fp8 + 1 scale = 132 B.
    assert got.kv_bytes_per_token == 61 * (656 + 132)
    assert got.kv_block_bytes == 64 * 61 * (656 + 132)
    assert dict(got.kv_by_kind) == {"latent_fp8": 61 * 656, "index_key_fp8": 61 * 132}
    bf16 = capacity_ledger(config, torch.bfloat16, 64, "auto", False, 8192)
    assert bf16.kv_bytes_per_token == 61 * (512 + 64 + 128) * 2
    assert 671e9 < got.num_parameters < 673e9  # 671B published (no MTP layer) plus the indexers
    assert got.kda_slot_bytes == 0


def test_fp8_kv_per_token_of_tiny_k3():
    # Latent row: Dc = 32 -> 32 + 4 * ceil(32 / 128) + 2 * 8 (bf16 rope) = 52; index key 16 + 4 = 20.
    got = ledger("k3", kv_format="fp8")
    assert got.kv_by_kind == (("latent_fp8", 52), ("index_key_fp8", 20))
    assert got.kv_bytes_per_token == 52 + 20


def test_workspace_terms_from_config_numbers():
    got = dict(ledger("k3", max_num_batched_tokens=8, max_num_seqs=256).workspace)
    assert got["hidden states"] == 3 * 8 * 64 * 4
    # The widest projection of the tiny k3 is the indexer query: 32 heads x 16 dims.
    assert got["largest projection (indexer query)"] == 8 * 32 * 16 * 4
    assert got["MoE routed experts"] == 8 * 2 * (2 * 64 + 3 * 32) * 4 + 8 * 8 * 4
    assert got["logits (8 rows)"] == 8 * 1024 * (4 + 4)  # rows capped by the step's tokens


# ---- transfer and fit ---------------------------------------------------------------------------


@pytest.mark.parametrize("context_len, blocks", [(1, 1), (16, 1), (17, 2), (4096, 256)])
def test_transfer_bytes_are_whole_blocks_plus_one_slot(context_len, blocks):
    got = ledger("k3")
    assert got.kv_blocks(context_len) == blocks
    assert got.transfer_bytes(context_len) == blocks * 3584 + 19200
    assert fit(got, GIB, context_len).transfer_bytes == got.transfer_bytes(context_len)


def test_fit_arithmetic_and_monotone_in_memory():
    got = ledger("k3")
    per_request = 256 * 3584 + 19200
    result = fit(got, GIB, 4096)
    assert result.requests == (GIB - got.weight_bytes - got.workspace_bytes) // per_request
    assert result.kv_blocks == 256 * result.requests and result.kda_slots == result.requests
    assert 0 <= result.free_bytes < per_request
    parts = ("weight", "workspace", "kv", "kda", "free")
    assert sum(result.fraction(p) for p in parts) == pytest.approx(1.0)
    previous = -1
    for mib in range(40, 400, 7):
        count = fit(got, mib << 20, 4096).requests
        assert count >= previous
        previous = count


def test_fit_with_a_draft_counts_its_weights_and_the_speculative_part():
    target, draft = ledger("k3"), ledger(load_model_config(with_layers(preset_config("k3", "tiny"), 2)))
    plain, spec = fit(target, GIB, 4090), fit(target, GIB, 4090, draft=draft, num_draft_tokens=7)
    # 4090 tokens take 256 blocks; 4097 drafted positions take 257 (one more target block). The target
    # keeps a KDA slot per draft (--kda-rollback states; one checkpoint slot with replay), the draft its
    # own slot and a checkpoint before each of the 7 drafts it feeds.
    drafted = 3584 + draft.kv_blocks(4097) * draft.kv_block_bytes + 8 * draft.kda_slot_bytes
    speculative = 7 * 19200 + drafted
    assert spec.spec_bytes_per_request == speculative and spec.draft_weight_bytes == draft.weight_bytes
    replay = fit(target, GIB, 4090, draft=draft, num_draft_tokens=7, rollback="replay")
    assert replay.spec_bytes_per_request == 19200 + drafted
    assert spec.weight_bytes == target.weight_bytes + draft.weight_bytes
    assert spec.workspace_bytes == target.workspace_bytes + draft.workspace_bytes
    room = GIB - spec.weight_bytes - spec.workspace_bytes
    assert spec.requests == room // (256 * 3584 + 19200 + speculative) < plain.requests
    # The handoff carries the draft's prompt blocks (4090 tokens: 256 of them) and one draft slot.
    assert spec.draft_transfer_bytes == 256 * draft.kv_block_bytes + draft.kda_slot_bytes
    assert spec.transfer_bytes == plain.transfer_bytes + spec.draft_transfer_bytes
    assert plain.draft_transfer_bytes == 0
    parts = ("weight", "workspace", "kv", "kda", "spec", "free")
    assert sum(spec.fraction(p) for p in parts) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        fit(target, GIB, 4090, draft=draft)


@pytest.mark.parametrize("raw", [None, K3_LIKE], ids=["tiny-k3", "k3-like-48b"])
def test_limiting_resource_flips_from_kda_state_to_kv_with_context(raw):
    config = tiny("k3") if raw is None else load_model_config(raw)
    got = capacity_ledger(config, torch.bfloat16, 16, "auto", False, 2048)
    memory = got.weight_bytes + got.workspace_bytes + 64 * GIB
    short, long = fit(got, memory, 16), fit(got, memory, 131072)
    assert short.limiting == "kda_state" and short.kda_bytes > short.kv_bytes
    assert long.limiting == "kv" and long.kv_bytes > long.kda_bytes
    assert short.requests > long.requests > 0


def test_nothing_fits_names_weights_or_workspace():
    got = ledger("k3")
    alone = fit(got, got.weight_bytes, 4096)
    assert (alone.requests, alone.limiting, alone.kv_blocks) == (0, "weights", 0)
    squeezed = fit(got, got.weight_bytes + got.workspace_bytes // 2, 4096)
    assert (squeezed.requests, squeezed.limiting) == (0, "workspace")


@pytest.mark.parametrize(
    "kwargs, field",
    [({"block_size": 0}, "block_size"), ({"kv_format": "int4"}, "kv_format")],
    ids=["block-size", "kv-format"],
)
def test_bad_ledger_arguments_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ledger("k3", **kwargs)
    with pytest.raises(ValueError, match="context_len"):
        fit(ledger("k3"), GIB, 0)


def test_format_bytes():
    assert [format_bytes(n) for n in (656, 3584, 19200, 7 << 20, 131 << 30)] == [
        "656 B",
        "3.50 KiB",
        "18.8 KiB",
        "7.00 MiB",
        "131 GiB",
    ]


# ---- baton capacity ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Folders holding only a ``config.json`` (the command must never need weights)."""
    root = tmp_path_factory.mktemp("capacity")
    made = {}
    for name, raw in (
        ("k3", preset_config("k3", "tiny")),
        ("deepseek", preset_config("deepseek_v32", "tiny")),
        ("bad", {**preset_config("k3", "tiny"), "kv_lora_rank": "wide"}),
        ("k3-draft", with_layers(preset_config("k3", "tiny"), 2)),
    ):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(raw))
        made[name] = root / name
    (root / "empty").mkdir()
    made["empty"] = root / "empty"
    return made


@pytest.fixture(scope="module")
def runs(folders) -> dict[str, subprocess.CompletedProcess]:
    """The subprocess runs, started together (each pays the torch import)."""
    k3 = str(folders["k3"])
    commands = {
        "human": ["--model", k3, "--memory-gib", "1"],
        "json": ["--model", str(folders["deepseek"]), "--memory-gib", "0.5", "--context-len", "16",
                 "--context-len", "4096,32768", "--dtype", "bfloat16", "--kv-format", "fp8", "--json"],
        "memory": ["--model", k3, "--memory-gib", "0"],
        "cpu-kernels": ["--model", k3, "--memory-gib", "1", "--device", "cpu", "--json"],
        "no-config": ["--model", str(folders["empty"]), "--memory-gib", "1"],
    }  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO))
    started = {
        name: subprocess.Popen(
            [sys.executable, "-m", "cli.main", "capacity", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        for name, args in commands.items()
    }
    done = {}
    for name, process in started.items():
        out, err = process.communicate(timeout=120)
        done[name] = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    return done


def test_cli_human_tables(runs):
    result = runs["human"]
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for heading in (
        "Persistent state",
        "Workspace per step (ESTIMATE",
        "Transfer per request",
        "Fit in 1.00 GiB",
    ):
        assert heading in out
    assert "KV per token               224 B" in out
    assert "KDA state per request   18.8 KiB" in out
    # Default context lengths, and 1,101 requests of 4,096 tokens (as fit computes).
    got = ledger("k3")
    rows = [
        line.split() for line in out.splitlines() if line.strip().startswith(("4,096", "32,768", "131,072"))
    ]
    assert [row[0] for row in rows] == ["4,096", "32,768", "131,072"] * 2
    assert rows[3][1] == f"{fit(got, GIB, 4096).requests:,}" and rows[3][-1] == "kv"


def test_cli_records_the_kernel_backend(runs):
    """The resolved ``--kernels``: triton on the default CUDA device, reference on the CPU."""
    assert ", kernels triton," in runs["human"].stdout.splitlines()[0]
    result = runs["cpu-kernels"]
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["kernels"] == "reference"


def test_cli_json_matches_the_library(runs):
    result = runs["json"]
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    config = tiny("deepseek_v32")
    want = capacity_ledger(config, torch.bfloat16, 16, "fp8", False, 8192)
    assert report["ledger"] == json.loads(json.dumps(ledger_dict(want)))
    assert report["ledger"]["kv_bytes_per_token"] == 4 * (52 + 20)
    assert [f["context_len"] for f in report["fits"]] == [16, 4096, 32768]
    memory = GIB // 2
    assert report["memory_bytes"] == memory and report["nothing_fits"] is False
    assert report["fits"][1]["requests"] == fit(want, memory, 4096).requests
    assert all(isinstance(f["kv_bytes"], int) for f in report["fits"])


def test_cli_error_exits(runs):
    assert runs["memory"].returncode == 2
    assert runs["memory"].stderr.startswith("baton capacity: error: --memory-gib")
    assert runs["no-config"].returncode == 2
    assert "baton capacity: error:" in runs["no-config"].stderr and "config.json" in runs["no-config"].stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--memory-gib", "-2"], "--memory-gib"),
        (["--memory-gib", "1", "--context-len", "0"], "--context-len"),
        (["--memory-gib", "1", "--context-len", "4096,"], "--context-len"),
        (["--memory-gib", "1", "--block-size", "0"], "--block-size"),
    ],
    ids=["negative-memory", "zero-context", "empty-context", "zero-block"],
)
def test_cli_bad_arguments_in_process(args, needle, folders, capsys):
    assert baton_main(["capacity", "--model", str(folders["k3"]), *args]) == 2
    assert capsys.readouterr().err.startswith(f"baton capacity: error: {needle}")


def test_cli_invalid_config_names_the_field(folders, capsys):
    assert baton_main(["capacity", "--model", str(folders["bad"]), "--memory-gib", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("baton capacity: error:") and "kv_lora_rank" in err


def test_cli_nothing_fits_exits_zero(folders, capsys):
    assert baton_main(["capacity", "--model", str(folders["k3"]), "--memory-gib", "0.001"]) == 0
    out = capsys.readouterr().out
    assert "nothing fits: the weights alone" in out and "--memory-gib" in out
    assert baton_main(["capacity", "--model", str(folders["k3"]), "--memory-gib", "0.001", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["nothing_fits"] is True and all(f["requests"] == 0 for f in report["fits"])


def test_per_rank_kv_and_kda_under_tp_and_dcp(folders, capsys):
    """``--tp 2 --dcp 2``: a rank's KDA slot holds half the heads' state, its KV blocks half a context's
    tokens (rounded up to whole blocks), the MLA latent per token is whole; the fit is per device."""
    one, split = ledger("k3"), ledger("k3", tp=2, dcp=2)
    assert one.kda_slot_bytes == 2 * split.kda_slot_bytes  # tiny k3: 64-byte aligned fields halve exactly
    assert split.kv_block_bytes == one.kv_block_bytes
    assert [split.kv_blocks(n) for n in (1, 32, 33, 4096)] == [1, 1, 2, 128]
    assert fit(split, GIB, 4096).requests > fit(one, GIB, 4096).requests
    args = ["--memory-gib", "1", "--context-len", "4096", "--device", "cpu", "--tp", "2", "--dcp", "2"]
    assert baton_main(["capacity", "--model", str(folders["k3"]), *args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["ledger"]["tp"], report["ledger"]["dcp"]) == (2, 2)
    assert report["ledger"]["kda_slot_bytes"] == split.kda_slot_bytes
    assert report["fits"][0]["kv_blocks_per_request"] == 128
    assert report["fits"][0]["requests"] == fit(split, GIB, 4096).requests
    assert baton_main(["capacity", "--model", str(folders["k3"]), *args]) == 0
    assert (
        "--tp 2 --dcp 2 --ep 1: 4 ranks; weights, KV and KDA figures are one rank's"
        in capsys.readouterr().out
    )
    assert baton_main(["capacity", "--model", str(folders["k3"]), "--memory-gib", "1", "--tp", "3"]) == 2
    assert "--tp 3: does not divide 4 attention heads" in capsys.readouterr().err


def test_per_rank_weight_bytes_equal_a_loaded_shard(tiny_checkpoint):
    """TP 2 + EP 2: the ledger's weights are what rank 1 loads of the checkpoint (a shard, not the model)."""
    rank = ParallelContext(ParallelLayout(tp=2, ep=2), rank=1)
    shard = load_model(tiny_checkpoint("k3"), dtype=torch.float32, parallel=rank)
    loaded = sum(p.numel() * p.element_size() for p in shard.parameters())
    split = ledger("k3", tp=2, ep=2)
    assert split.weight_bytes == loaded < ledger("k3").weight_bytes


def test_cli_with_a_draft_reports_and_fits_the_speculative_part(folders, capsys):
    k3, draft = str(folders["k3"]), str(folders["k3-draft"])
    common = ["capacity", "--model", k3, "--memory-gib", "1", "--context-len", "4090", "--json"]
    assert baton_main([*common, "--draft-model", draft, "--num-draft-tokens", "7"]) == 0
    report = json.loads(capsys.readouterr().out)
    target, drafted = ledger("k3"), ledger(load_model_config(folders["k3-draft"]))
    assert report["draft"]["ledger"]["weight_bytes"] == drafted.weight_bytes
    (result,) = report["fits"]
    expected = fit(target, GIB, 4090, draft=drafted, num_draft_tokens=7)
    assert result["requests"] == expected.requests and result["spec_bytes_per_request"] > 0
    assert result["transfer_bytes"] == expected.transfer_bytes > fit(target, GIB, 4090).transfer_bytes
    assert result["draft_transfer_bytes"] == drafted.transfer_bytes(4090)
    assert baton_main([*common[:-1], "--draft-model", draft, "--num-draft-tokens", "7"]) == 0
    out = capsys.readouterr().out
    assert "Speculative decoding (--draft-model" in out
    transfer = out.split("Transfer per request")[1].splitlines()
    assert "the draft's blocks and slot" in transfer[0] and "draft" in transfer[1]
    assert format_bytes(expected.draft_transfer_bytes) in transfer[3]
    assert format_bytes(expected.transfer_bytes) in transfer[3]
    for bad, needle in (
        (["--draft-model", draft], "--draft-model, --num-draft-tokens: give both"),
        (
            ["--draft-model", str(folders["deepseek"]), "--num-draft-tokens", "2"],
            "--draft-model: a deepseek_v32",
        ),
        (["--draft-model", draft, "--num-draft-tokens", "2", "--tp", "2"], "--draft-model: speculative"),
    ):
        assert baton_main([*common, *bad]) == 2
        assert needle in capsys.readouterr().err
