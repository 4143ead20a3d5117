"""The ``full`` presets: Kimi-Linear-48B-A3B per-layer shapes (checked against the installed
transformers' ``KimiLinearConfig`` defaults) and the K3 shape, cut to ``--layers``, and the random
model built straight on a device."""

import pytest
import torch
from transformers import KimiLinearConfig

from services.engine.checkpoint.presets import preset_config, with_layers
from services.engine.checkpoint.random_model import build_random_model
from services.engine.model.config_loader import load_model_config

SHAPE_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_attention_heads",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "num_experts",
    "num_experts_per_token",
    "num_shared_experts",
    "routed_scaling_factor",
)


def test_kimi_linear_full_matches_transformers_defaults():
    raw, defaults = preset_config("kimi_linear", "full"), KimiLinearConfig()
    assert {k: raw[k] for k in SHAPE_KEYS} == {k: getattr(defaults, k) for k in SHAPE_KEYS}
    linear = raw["linear_attn_config"]
    assert (linear["num_heads"], linear["head_dim"], linear["short_conv_kernel_size"]) == (
        defaults.linear_num_heads,
        defaults.linear_head_dim,
        defaults.linear_conv_kernel_dim,
    )
    config = load_model_config(raw)
    assert config.num_hidden_layers == defaults.num_hidden_layers == 27
    assert (config.kda.num_heads, config.kda.head_dim, config.moe.num_experts) == (32, 128, 256)


def test_k3_full_adds_the_indexer_and_its_experts():
    config = load_model_config(preset_config("k3", "full"))
    assert config.family == "k3"
    assert (config.indexer.n_heads, config.indexer.head_dim, config.indexer.topk) == (64, 128, 2048)
    assert (config.moe.num_experts, config.moe.num_experts_per_tok) == (896, 16)
    assert (config.hidden_size, config.kv_lora_rank, config.qk_rope_head_dim) == (2304, 512, 64)


def test_layers_keep_the_3_to_1_ratio_and_a_dense_first_mlp():
    config = load_model_config(with_layers(preset_config("k3", "full"), 8))
    assert config.layer_types == ("kda", "kda", "kda", "mla") * 2
    assert config.mlp_types == ("dense",) + ("moe",) * 7
    with pytest.raises(ValueError, match="--layers: must be a positive integer, got 0"):
        with_layers(preset_config("k3", "full"), 0)
    with pytest.raises(ValueError, match="--layers: only for the KDA families"):
        with_layers(preset_config("deepseek_v32", "tiny"), 4)


def test_random_model_is_built_on_the_device_and_runs():
    model = build_random_model("k3", "tiny", "cpu", torch.float32, layers=4, seed=1)
    again = build_random_model("k3", "tiny", "cpu", torch.float32, layers=4, seed=1)
    assert model.config.layer_types == ("kda", "kda", "kda", "mla")
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True))
    norms = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
    assert norms and all(bool((p == 1).all()) for p in norms)
    assert model.model.layers[0].self_attn.forget_gate.A_log.exp().min() >= 1.0
    with torch.no_grad():
        logits = model(torch.tensor([[5, 6, 7]]))
    assert logits.shape == (1, 3, model.config.vocab_size) and torch.isfinite(logits).all()
