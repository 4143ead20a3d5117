"""Config validation: every bad field is an error that names it, raised before any weight is read."""

import json
import time

import pytest

from common.config_fields import ConfigError
from services.engine.checkpoint.loader import load_model
from services.engine.checkpoint.presets import preset_config
from services.engine.model.config_loader import load_model_config
from tests.conftest import FAMILIES


@pytest.mark.parametrize("family", FAMILIES)
def test_presets_parse_to_their_family(family):
    config = load_model_config(preset_config(family, "tiny"))
    assert config.family == family
    assert (config.indexer is None) == (family == "kimi_linear")
    assert (config.kda is None) == (family == "deepseek_v32")
    assert len(config.layer_types) == config.num_hidden_layers


def test_k3_model_type_is_accepted_as_its_own_type():
    raw = preset_config("k3", "tiny")
    raw["model_type"] = "k3"
    assert load_model_config(raw).family == "k3"


def test_kimi_layer_types_list_and_linear_attn_config_agree():
    raw = preset_config("kimi_linear", "tiny")
    raw["layer_types"] = ["linear_attention", "linear_attention", "full_attention", "linear_attention"]
    assert load_model_config(raw).layer_types == ("kda", "kda", "mla", "kda")


def _mutate(family, change):
    raw = preset_config(family, "tiny")
    change(raw)
    return raw


BAD_CONFIGS = {
    "missing-hidden_size": ("k3", lambda r: r.pop("hidden_size"), "hidden_size", "missing"),
    "missing-num_experts": ("kimi_linear", lambda r: r.pop("num_experts"), "num_experts", "missing"),
    "missing-index_topk": ("deepseek_v32", lambda r: r.pop("index_topk"), "index_topk", "missing"),
    "unknown-model_type": ("k3", lambda r: r.update(model_type="llama"), "model_type", "not supported"),
    "missing-model_type": ("k3", lambda r: r.pop("model_type"), "model_type", "missing"),
    "string-vocab": ("k3", lambda r: r.update(vocab_size="1024"), "vocab_size", "integer"),
    "negative-layers": ("k3", lambda r: r.update(num_hidden_layers=0), "num_hidden_layers", ">= 1"),
    "odd-rope-dim": ("deepseek_v32", lambda r: r.update(qk_rope_head_dim=7), "qk_rope_head_dim", "even"),
    "kv-heads-differ": ("k3", lambda r: r.update(num_key_value_heads=2), "num_key_value_heads", "must equal"),
    "deepseek-no-qlora": ("deepseek_v32", lambda r: r.update(q_lora_rank=None), "q_lora_rank", "required"),
    "group-not-dividing": ("k3", lambda r: r.update(n_group=3), "n_group", "divide"),
    "topk-group-too-big": ("k3", lambda r: r.update(topk_group=5), "topk_group", "<= n_group"),
    "too-many-experts-per-token": (
        "k3",
        lambda r: r.update(num_experts_per_tok=9),
        "num_experts_per_tok",
        "exceeds",
    ),
    "gelu": ("k3", lambda r: r.update(hidden_act="gelu"), "hidden_act", "not supported"),
    "quantized": (
        "deepseek_v32",
        lambda r: r.update(quantization_config={"quant_method": "fp8"}),
        "quantization_config",
        "not supported",
    ),
    "layer-missing-from-lists": (
        "k3",
        lambda r: r["linear_attn_config"].update(kda_layers=[1, 2]),
        "linear_attn_config",
        "layer 4",
    ),
    "layer-out-of-range": (
        "k3",
        lambda r: r["linear_attn_config"].update(kda_layers=[1, 2, 9]),
        "linear_attn_config.kda_layers",
        "outside",
    ),
    "layer-types-disagree": (
        "kimi_linear",
        lambda r: r.update(layer_types=["full_attention"] * 4),
        "layer_types",
        "disagrees",
    ),
    "no-layer-kinds": ("kimi_linear", lambda r: r.pop("linear_attn_config"), "layer_types", "missing"),
    "yarn-without-factor": (
        "deepseek_v32",
        lambda r: r.update(rope_parameters={"rope_type": "yarn"}),
        "rope_parameters.factor",
        "required",
    ),
    "unsupported-rope": (
        "deepseek_v32",
        lambda r: r.update(rope_parameters={"rope_type": "longrope"}),
        "rope_parameters.rope_type",
        "not supported",
    ),
    "index-dim-below-rope": ("deepseek_v32", lambda r: r.update(index_head_dim=4), "index_head_dim", ">="),
    "bad-dtype": ("k3", lambda r: r.update(torch_dtype="int8"), "torch_dtype", "not supported"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS), ids=list(BAD_CONFIGS))
def test_bad_config_names_the_field(case):
    family, change, field, words = BAD_CONFIGS[case]
    with pytest.raises(ConfigError) as caught:
        load_model_config(_mutate(family, change))
    assert caught.value.field == field
    assert f"{field}: " in str(caught.value) and words in str(caught.value)


def test_bad_config_fails_before_weights_are_read(tmp_path):
    """The folder's safetensors are garbage: a config error must come first, and fast."""
    raw = _mutate("k3", lambda r: r.pop("kv_lora_rank"))
    (tmp_path / "config.json").write_text(json.dumps(raw))
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file" * 1000)
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="kv_lora_rank: missing"):
        load_model(tmp_path)
    assert time.perf_counter() - start < 0.5


def test_missing_and_malformed_config_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_model_config(tmp_path)


def test_unknown_keys_are_reported_not_fatal(caplog):
    raw = preset_config("k3", "tiny")
    raw["mystery_knob"] = 3
    load_model_config(raw)
    assert "mystery_knob" in caplog.text
