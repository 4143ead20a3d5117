"""Checkpoint loading: both tensor layouts, sharded folders, and every bad-tensor case named; a load in a
fresh process (a worker's, a rank's) pays no ``torch._dynamo`` or ``sympy`` import."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.engine.checkpoint.loader import CheckpointError, load_model
from services.engine.checkpoint.presets import preset_config
from services.engine.checkpoint.random_init import write_random_checkpoint
from tests.conftest import FAMILIES


@pytest.mark.parametrize("family", FAMILIES)
def test_hub_and_transformers_layouts_load_identically(family, tiny_checkpoint):
    hub = load_model(tiny_checkpoint(family, "hub"), dtype=torch.float32)
    fused = load_model(tiny_checkpoint(family, "transformers"), dtype=torch.float32)
    hub_state, fused_state = hub.state_dict(), fused.state_dict()
    assert hub_state.keys() == fused_state.keys()
    for name, tensor in hub_state.items():
        assert torch.equal(tensor, fused_state[name]), name


def test_hub_layout_really_has_per_expert_tensors(tiny_checkpoint):
    names = load_file(tiny_checkpoint("k3", "hub") / "model.safetensors").keys()
    assert "model.layers.1.block_sparse_moe.experts.7.w3.weight" in names
    assert "model.layers.0.self_attn.q_conv1d.weight" in names
    assert not any("gate_up_proj" in n for n in names)


def test_sharded_checkpoint_loads_the_same(tiny_checkpoint, tmp_path):
    write_random_checkpoint(tmp_path, preset_config("deepseek_v32", "tiny"), seed=0, max_shard_bytes=100_000)
    assert len(list(tmp_path.glob("*.safetensors"))) > 3
    assert (tmp_path / "model.safetensors.index.json").is_file()
    sharded = load_model(tmp_path, dtype=torch.float32).state_dict()
    single = load_model(tiny_checkpoint("deepseek_v32"), dtype=torch.float32).state_dict()
    assert all(torch.equal(sharded[k], single[k]) for k in single)


def test_bfloat16_load_keeps_router_in_float32(tiny_checkpoint):
    model = load_model(tiny_checkpoint("k3"), dtype=torch.bfloat16)
    params = dict(model.named_parameters())
    assert params["model.layers.1.mlp.gate.weight"].dtype == torch.float32
    assert params["model.layers.0.self_attn.forget_gate.dt_bias"].dtype == torch.float32
    assert params["model.layers.1.mlp.experts.gate_up_proj"].dtype == torch.bfloat16
    logits = model(torch.tensor([[3, 4, 5]]))
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()


def _edit_checkpoint(source, destination, edit):
    shutil.copytree(source, destination)
    path = destination / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, str(path))
    return destination


BAD_TENSORS = {
    "missing-expert": (
        lambda t: t.pop("model.layers.1.block_sparse_moe.experts.3.w2.weight"),
        "missing tensor 'model.layers.1.mlp.experts.down_proj'",
    ),
    "missing-norm": (lambda t: t.pop("model.norm.weight"), "missing tensor 'model.norm.weight'"),
    "wrong-shape": (
        lambda t: t.update({"model.layers.2.self_attn.kv_b_proj.weight": torch.zeros(3, 3)}),
        "'model.layers.2.self_attn.kv_b_proj.weight' has shape [3, 3], expected",
    ),
    "wrong-expert-shape": (
        lambda t: t.update({"model.layers.1.block_sparse_moe.experts.0.w1.weight": torch.zeros(4, 64)}),
        "experts.0.w1.weight' has shape [4, 64]",
    ),
    "unexpected": (
        lambda t: t.update({"model.layers.0.self_attn.rotary.inv_freq": torch.zeros(4)}),
        "unexpected tensor 'model.layers.0.self_attn.rotary.inv_freq'",
    ),
    "expert-out-of-range": (
        lambda t: t.update({"model.layers.1.block_sparse_moe.experts.8.w1.weight": torch.zeros(32, 64)}),
        "unexpected tensor 'model.layers.1.block_sparse_moe.experts.8.w1.weight'",
    ),
    "indexer-on-kda-layer": (
        lambda t: t.update({"model.layers.0.self_attn.indexer.wk.weight": torch.zeros(16, 64)}),
        "unexpected tensor 'model.layers.0.self_attn.indexer.wk.weight'",
    ),
}


@pytest.mark.parametrize("case", list(BAD_TENSORS), ids=list(BAD_TENSORS))
def test_bad_checkpoint_tensor_is_named(case, tiny_checkpoint, tmp_path):
    edit, message = BAD_TENSORS[case]
    folder = _edit_checkpoint(tiny_checkpoint("k3", "hub"), tmp_path / "ckpt", edit)
    with pytest.raises(CheckpointError) as caught:
        load_model(folder)
    assert message in str(caught.value)


def test_duplicate_tensor_across_layouts_is_rejected(tiny_checkpoint, tmp_path):
    """A fused tensor and its per-expert pieces in one folder fill the same slice twice."""
    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint("k3", "hub"), folder)
    fused = load_file(tiny_checkpoint("k3", "transformers") / "model.safetensors")
    save_file(
        {"model.layers.1.mlp.experts.down_proj": fused["model.layers.1.mlp.experts.down_proj"]},
        str(folder / "model-extra.safetensors"),
    )
    with pytest.raises(CheckpointError, match="already filled"):
        load_model(folder)


def test_mtp_layers_are_skipped_by_name(tiny_checkpoint, tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint("deepseek_v32"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    (folder / "config.json").write_text(json.dumps(config))
    save_file({"model.layers.4.eh_proj.weight": torch.zeros(64, 128)}, str(folder / "mtp.safetensors"))
    load_model(folder)
    config["num_nextn_predict_layers"] = 0
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="unexpected tensor 'model.layers.4.eh_proj.weight'"):
        load_model(folder)


def test_out_of_vocabulary_input_is_rejected(tiny_checkpoint):
    model = load_model(tiny_checkpoint("kimi_linear"), dtype=torch.float32)
    with pytest.raises(
        ValueError, match=r"input_ids: id 1024 at position 1 is outside the vocabulary \[0, 1024\)"
    ):
        model(torch.tensor([[5, 1024, 3]]))
    with pytest.raises(ValueError, match="input_ids: id -1"):
        model(torch.tensor([[-1]]))


def test_loading_a_model_in_a_fresh_process_imports_no_dynamo_nor_sympy(tiny_checkpoint):
    """Building the empty model on the meta device skips the modules' initialisers (``nn.Embedding``'s
    ``normal_`` on meta would import ``torch._dynamo``: about 2.5 s of CPU at every worker start) and
    allocates without ``empty_like`` of meta tensors (which imports sympy: about 1 s)."""
    script = (
        "import sys; from services.engine.checkpoint.loader import load_model; "
        f"model = load_model({str(tiny_checkpoint('k3'))!r}); "
        "print(sum(p.numel() for p in model.parameters()), 'torch._dynamo' in sys.modules, "
        "'sympy' in sys.modules)"
    )
    repo = str(Path(__file__).resolve().parents[2])
    result = subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": repo}, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    parameters, dynamo_imported, sympy_imported = result.stdout.split()
    assert int(parameters) > 0 and (dynamo_imported, sympy_imported) == ("False", "False")
