"""Config presets for random checkpoints: ``tiny`` models small enough for tests on 2 CPU cores,
``small`` for GPU benchmarks, ``full`` with the real per-layer shapes, ``demo`` and ``draft`` (k3 only)
for the model trained and shipped with the repository and its distilled draft.

Each preset is a ``config.json`` dict in the family's own form (loadable by transformers for
``kimi_linear`` and ``deepseek_v32``; ``k3`` is ``kimi_linear`` plus the DSA indexer keys).
``full`` has the layer sizes of Kimi-Linear-48B-A3B (transformers' ``KimiLinearConfig`` defaults)
and a K3-shaped variant of it; choose how many layers with ``with_layers`` (``--layers``).
"""

from typing import Any

_TINY_COMMON: dict[str, Any] = {
    "vocab_size": 1024,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "n_group": 2,
    "topk_group": 2,
    "num_experts_per_tok": 2,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "first_k_dense_replace": 1,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

_KIMI_LINEAR_ATTN = {
    "head_dim": 16,
    "num_heads": 4,
    "short_conv_kernel_size": 4,
    "kda_layers": [1, 2, 4],
    "full_attn_layers": [3],
}

_INDEXER = {"index_n_heads": 32, "index_head_dim": 16, "index_topk": 16}

TINY = {
    "kimi_linear": {
        **_TINY_COMMON,
        "model_type": "kimi_linear",
        "architectures": ["KimiLinearForCausalLM"],
        "q_lora_rank": None,
        "num_experts": 8,
        "num_shared_experts": 1,
        "rms_norm_eps": 1e-5,
        "linear_attn_config": _KIMI_LINEAR_ATTN,
    },
    "k3": {
        **_TINY_COMMON,
        "model_type": "kimi_linear",
        "architectures": ["KimiLinearForCausalLM"],
        "q_lora_rank": 32,
        "num_experts": 8,
        "num_shared_experts": 1,
        "rms_norm_eps": 1e-5,
        "linear_attn_config": _KIMI_LINEAR_ATTN,
        **_INDEXER,
    },
    "deepseek_v32": {
        **_TINY_COMMON,
        "model_type": "deepseek_v32",
        "architectures": ["DeepseekV32ForCausalLM"],
        "q_lora_rank": 32,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        **_INDEXER,
    },
}

# "small": wide enough that a GPU benchmark measures kernels rather than launch overhead
# (about 0.47 B parameters), still quick to write as random weights.
_SMALL_OVERRIDES = {
    "vocab_size": 32768,
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "moe_intermediate_size": 512,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "kv_lora_rank": 256,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 32,
    "v_head_dim": 64,
    "n_group": 4,
    "topk_group": 2,
    "num_experts_per_tok": 4,
    "torch_dtype": "bfloat16",
}
_SMALL_LINEAR_ATTN = {
    "head_dim": 64,
    "num_heads": 16,
    "short_conv_kernel_size": 4,
    "kda_layers": [1, 2, 3, 5, 6, 7],
    "full_attn_layers": [4, 8],
}
SMALL = {
    family: {**config, **_SMALL_OVERRIDES}
    | ({"linear_attn_config": _SMALL_LINEAR_ATTN} if "linear_attn_config" in config else {})
    | ({"num_experts": 32} if "num_experts" in config else {"n_routed_experts": 32})
    | ({"index_n_heads": 16, "index_head_dim": 64, "index_topk": 512} if "index_n_heads" in config else {})
    for family, config in TINY.items()
}

# Kimi-Linear-48B-A3B per layer (transformers' KimiLinearConfig defaults; a test checks them): 32 KDA
# heads of 128, NoPE MLA with a 512 latent and 64 rope channels, 256 experts of 1024 (top 8) plus a
# shared one. The K3 shape adds a DSA indexer (64 heads of 128, top 2048) and has 896 experts (top 16).
_KIMI_LINEAR_48B = {
    "model_type": "kimi_linear",
    "architectures": ["KimiLinearForCausalLM"],
    "vocab_size": 163840,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "moe_intermediate_size": 1024,
    "num_hidden_layers": 27,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_experts": 256,
    "num_experts_per_token": 8,
    "num_shared_experts": 1,
    "num_expert_group": 1,
    "topk_group": 1,
    "moe_renormalize": True,
    "routed_scaling_factor": 2.446,
    "first_k_dense_replace": 1,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 163584,
    "eos_token_id": 163586,
    "pad_token_id": 163839,
    "linear_attn_config": {"head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4},
}
FULL = {
    "kimi_linear": _KIMI_LINEAR_48B,
    "k3": {
        **_KIMI_LINEAR_48B,
        "num_experts": 896,
        "num_experts_per_token": 16,
        "index_n_heads": 64,
        "index_head_dim": 128,
        "index_topk": 2048,
    },
}

# Every fourth layer is MLA (the real model's 3:1 KDA:MLA ratio); ``full`` lists its layers this way.
MLA_EVERY = 4


def _k3_layers(layers: int) -> dict[str, Any]:
    """The k3 layer lists of ``layers`` layers (``with_layers``' pattern), for presets defined here."""
    return {
        "kda_layers": [i for i in range(1, layers + 1) if i % MLA_EVERY != 0],
        "full_attn_layers": [i for i in range(1, layers + 1) if i % MLA_EVERY == 0],
    }


# "demo": the k3 model trained and shipped with the repository (``baton train``, ``docs/training.md``):
# every Baton code path (KDA, MLA with a DSA indexer whose top-k is smaller than a training window,
# MoE with a shared expert) at about 17.0 M parameters (10.7 M outside the embedding and the LM head;
# 34 MB in bfloat16, so model and draft ship in under 40 MB) with the demo tokenizer's ~12K vocabulary
# (replaced by the tokenizer's own at training time).
_DEMO_VOCAB = 12288
DEMO = {
    "k3": {
        **TINY["k3"],
        "vocab_size": _DEMO_VOCAB,
        "hidden_size": 256,
        "intermediate_size": 768,
        "moe_intermediate_size": 160,
        "num_hidden_layers": 8,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": 128,
        "kv_lora_rank": 128,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "n_group": 2,
        "topk_group": 2,
        "linear_attn_config": {"head_dim": 64, "num_heads": 4, "short_conv_kernel_size": 4, **_k3_layers(8)},
        "index_n_heads": 4,
        "index_head_dim": 32,
        "index_topk": 64,
    }
}
# "draft": the demo model's speculative draft (same family and tokenizer, distilled on its logits),
# about 1.8 M parameters, most of them the embedding and the LM head.
DRAFT = {
    "k3": {
        **DEMO["k3"],
        "hidden_size": 64,
        "intermediate_size": 192,
        "moe_intermediate_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "q_lora_rank": 32,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "num_experts": 4,
        "n_group": 1,
        "topk_group": 1,
        "linear_attn_config": {"head_dim": 32, "num_heads": 2, "short_conv_kernel_size": 4, **_k3_layers(4)},
        "index_n_heads": 2,
        "index_head_dim": 16,
        "index_topk": 64,
    }
}

PRESETS = {"tiny": TINY, "small": SMALL, "full": FULL, "demo": DEMO, "draft": DRAFT}


def with_layers(config: dict[str, Any], layers: int) -> dict[str, Any]:
    """``config`` cut or extended to ``layers`` layers: MLA at every fourth (1-based), KDA elsewhere, the
    first layer's MLP dense (the others MoE).

    Raises:
        ValueError: ``layers`` below 1, or a family without KDA layers, naming ``--layers``.
    """
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ValueError(f"--layers: must be a positive integer, got {layers!r}")
    if "linear_attn_config" not in config:
        raise ValueError(f"--layers: only for the KDA families (kimi_linear, k3), not {config['model_type']}")
    mla = [i for i in range(1, layers + 1) if i % MLA_EVERY == 0]
    kda = [i for i in range(1, layers + 1) if i % MLA_EVERY != 0]
    linear = {**config["linear_attn_config"], "kda_layers": kda, "full_attn_layers": mla}
    return {**config, "num_hidden_layers": layers, "linear_attn_config": linear}


def preset_config(family: str, preset: str) -> dict[str, Any]:
    """A fresh copy of the preset's config dict.

    Raises:
        ValueError: unknown family or preset, naming the valid choices.
    """
    if preset not in PRESETS:
        raise ValueError(f"--preset: unknown preset {preset!r} (choose from {', '.join(PRESETS)})")
    if family not in PRESETS[preset]:
        raise ValueError(f"--family: unknown family {family!r} (choose from {', '.join(PRESETS[preset])})")
    config = {
        key: (dict(value) if isinstance(value, dict) else value)
        for key, value in PRESETS[preset][family].items()
    }
    return with_layers(config, config["num_hidden_layers"]) if preset == "full" else config
