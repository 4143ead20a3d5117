"""Our model's logits against transformers' reference models, float32, relative max error <= 1e-4.

Two directions: transformers builds a random model and ``save_pretrained``s it, we load it; and we
write a random checkpoint (hub layout, as released models ship), transformers loads it. The K3 hybrid
is checked against the composed reference of ``tests/reference_models.py``.

The indexers have 16-32 heads so that exact ties among index scores (every head ReLU'd to zero) are
improbable: transformers' ``torch.topk`` breaks ties arbitrarily, ours by position (DESIGN.md 6).
"""

import pytest
import torch
from transformers import DeepseekV32Config, DeepseekV32ForCausalLM, KimiLinearConfig, KimiLinearForCausalLM

from services.engine.checkpoint.loader import load_model
from tests.conftest import relative_error
from tests.reference_models import load_reference, reference_logits

TOLERANCE = 1e-4

_MLA = {"kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12}
_SMALL = {
    "vocab_size": 211,
    "hidden_size": 48,
    "intermediate_size": 64,
    "moe_intermediate_size": 24,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    **_MLA,
}


def _kimi(q_lora_rank, kda_layers, mla_layers, **extra):
    layers = len(kda_layers) + len(mla_layers)
    linear = {
        "head_dim": 8,
        "num_heads": 3,
        "short_conv_kernel_size": 4,
        "kda_layers": kda_layers,
        "full_attn_layers": mla_layers,
    }
    fields = {
        **_SMALL,
        "num_hidden_layers": layers,
        "q_lora_rank": q_lora_rank,
        "num_experts": 8,
        "first_k_dense_replace": 1,
        "linear_attn_config": linear,
        **extra,
    }
    return KimiLinearConfig(**fields)


def _deepseek(index_topk, rope_parameters=None, **extra):
    rope = rope_parameters or {"rope_type": "default", "rope_theta": 10000.0}
    fields = {
        **_SMALL,
        "num_hidden_layers": 3,
        "q_lora_rank": 24,
        "n_routed_experts": 8,
        "first_k_dense_replace": 1,
        "index_n_heads": 16,
        "index_head_dim": 16,
        "index_topk": index_topk,
        "rope_parameters": rope,
        "max_position_embeddings": 4096,
        **extra,
    }
    return DeepseekV32Config(**fields)


_YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 64,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}

TRANSFORMERS_CASES = {
    "kimi-noqlora-kda,mla,kda,kda": (KimiLinearForCausalLM, lambda: _kimi(None, [1, 3, 4], [2])),
    "kimi-qlora-mla,kda,kda,mla": (KimiLinearForCausalLM, lambda: _kimi(20, [2, 3], [1, 4])),
    "kimi-qlora-3groups-kda,kda,mla": (
        KimiLinearForCausalLM,
        lambda: _kimi(20, [1, 2], [3], n_group=4, topk_group=2),
    ),
    "deepseek-topk7-below-len": (DeepseekV32ForCausalLM, lambda: _deepseek(7)),
    "deepseek-topk500-above-len": (DeepseekV32ForCausalLM, lambda: _deepseek(500)),
    "deepseek-yarn-topk11": (DeepseekV32ForCausalLM, lambda: _deepseek(11, _YARN)),
}
SEQ_LENS = (1, 23, 70)


def _randomise_buffers(model: torch.nn.Module) -> None:
    """transformers initialises the router selection bias to zero; make it matter."""
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name.endswith("e_score_correction_bias"):
                tensor.normal_(0.0, 0.05)


@pytest.mark.parametrize("case", list(TRANSFORMERS_CASES), ids=list(TRANSFORMERS_CASES))
def test_transformers_checkpoint_matches(case, tmp_path):
    model_class, make_config = TRANSFORMERS_CASES[case]
    torch.manual_seed(7)
    config = make_config()
    config.dtype = torch.float32
    reference = model_class(config).eval()
    _randomise_buffers(reference)
    reference.save_pretrained(tmp_path)
    ours = load_model(tmp_path, dtype=torch.float32)
    generator = torch.Generator().manual_seed(3)
    for seq_len in SEQ_LENS:
        ids = torch.randint(0, config.vocab_size, (2, seq_len), generator=generator)
        with torch.no_grad():
            got = ours(ids)
        want = reference_logits(reference, ids)
        assert got.shape == want.shape == (2, seq_len, config.vocab_size)
        assert relative_error(got, want) <= TOLERANCE, f"{case} T={seq_len}"


OUR_CASES = {
    "k3-qlora-topk16": ("k3", {}),
    "k3-noqlora-topk5": ("k3", {"q_lora_rank": None, "index_topk": 5}),
    "k3-topk4096-dense": ("k3", {"index_topk": 4096}),
    "k3-mla-first": (
        "k3",
        {
            "linear_attn_config": {
                "head_dim": 16,
                "num_heads": 4,
                "short_conv_kernel_size": 4,
                "kda_layers": [2, 3],
                "full_attn_layers": [1, 4],
            }
        },
    ),
    "kimi_linear": ("kimi_linear", {}),
    "deepseek_v32": ("deepseek_v32", {}),
}


@pytest.mark.parametrize("case", list(OUR_CASES), ids=list(OUR_CASES))
def test_our_checkpoint_matches_reference(case, tiny_checkpoint):
    family, overrides = OUR_CASES[case]
    model_dir = tiny_checkpoint(family, "hub", **overrides)
    ours = load_model(model_dir, dtype=torch.float32)
    reference = load_reference(model_dir)
    generator = torch.Generator().manual_seed(5)
    for seq_len in (1, 37, 129):
        ids = torch.randint(0, ours.config.vocab_size, (1, seq_len), generator=generator)
        with torch.no_grad():
            got = ours(ids)
        assert relative_error(got, reference_logits(reference, ids)) <= TOLERANCE, f"{case} T={seq_len}"
