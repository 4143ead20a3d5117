"""The ``demo`` model and its ``draft``: k3 shapes (KDA:MLA 3:1, MoE with a shared expert, a DSA indexer
whose top-k is below a training window) at the sizes issue 17 ships; their parameter counts printed."""

import pytest
import torch

from services.engine.checkpoint.presets import preset_config
from services.engine.model.causal_lm import CausalLM
from services.engine.model.config_loader import load_model_config
from trainer.pretrain_settings import PretrainSettings

SIZES = {"demo": (10e6, 25e6), "draft": (1e6, 3e6)}


@pytest.mark.parametrize("preset", sorted(SIZES))
def test_demo_presets(preset):
    raw = preset_config("k3", preset)
    config = load_model_config(raw)
    with torch.device("meta"):
        model = CausalLM(config)
    count = sum(p.numel() for p in model.parameters())
    print(f"k3 {preset}: {count:,} parameters ({count - 2 * raw['hidden_size'] * raw['vocab_size']:,} "
          "without the embedding and the LM head)")  # fmt: skip
    low, high = SIZES[preset]
    assert low <= count <= high
    layers = raw["linear_attn_config"]
    assert len(layers["kda_layers"]) == 3 * len(layers["full_attn_layers"])
    assert raw["num_shared_experts"] == 1 and raw["num_experts"] > raw["num_experts_per_tok"]
    assert raw["index_topk"] < PretrainSettings(out=None).seq_len
