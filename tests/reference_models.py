"""transformers reference models for the three families, built from a Baton checkpoint folder.

``kimi_linear`` and ``deepseek_v32`` load directly with ``from_pretrained``. The K3 hybrid has no
transformers class: it is ``KimiLinearForCausalLM`` whose MLA layers get transformers' own
``DeepseekV32Indexer`` (DESIGN.md: "the two above, layer by layer"), applied NoPE like Kimi's MLA,
with its top-k folded into the attention mask exactly as ``DeepseekV32Attention`` does.
"""

import json
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import DeepseekV32Config, DeepseekV32ForCausalLM, KimiLinearForCausalLM
from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32Indexer


def load_reference(model_dir: Path) -> torch.nn.Module:
    """The transformers model matching a checkpoint folder (float32, eager attention, eval mode)."""
    raw = json.loads((model_dir / "config.json").read_text())
    if raw["model_type"] == "deepseek_v32":
        return DeepseekV32ForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="eager"
        ).eval()
    model = KimiLinearForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    if "index_n_heads" in raw:
        _attach_indexers(model, raw, model_dir)
    return model


def reference_logits(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids).logits


def _attach_indexers(model: KimiLinearForCausalLM, raw: dict, model_dir: Path) -> None:
    query_dim = raw.get("q_lora_rank") or raw["hidden_size"]
    index_config = DeepseekV32Config(
        hidden_size=raw["hidden_size"],
        q_lora_rank=query_dim,
        qk_rope_head_dim=raw["qk_rope_head_dim"],
        index_n_heads=raw["index_n_heads"],
        index_head_dim=raw["index_head_dim"],
        index_topk=raw["index_topk"],
    )
    tensors = {}
    for file in model_dir.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as handle:
            tensors.update({k: handle.get_tensor(k) for k in handle.keys() if ".indexer." in k})
    for index, layer in enumerate(model.model.layers):
        if layer.block_type != "full_attention":
            continue
        indexer = DeepseekV32Indexer(index_config, index).float().eval()
        prefix = f"model.layers.{index}.self_attn.indexer."
        indexer.load_state_dict(
            {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix)}
        )
        _wrap_attention(layer.self_attn, indexer, raw.get("q_lora_rank") is not None)


def _wrap_attention(attention: torch.nn.Module, indexer: DeepseekV32Indexer, has_q_lora: bool) -> None:
    original_forward = attention.forward

    def forward(hidden_states, attention_mask=None, cache=None, **kwargs):
        batch, seq_len, _ = hidden_states.shape
        if has_q_lora:
            q_resid = attention.q_a_layernorm(attention.q_a_proj(hidden_states))
        else:
            q_resid = hidden_states
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril().expand(batch, seq_len, seq_len)
        rope_dim = indexer.qk_rope_head_dim
        identity = (torch.ones(batch, seq_len, rope_dim), torch.zeros(batch, seq_len, rope_dim))  # NoPE
        topk = indexer(hidden_states, q_resid, identity, causal, None)
        selected = torch.zeros(batch, seq_len, seq_len, dtype=torch.bool).scatter(-1, topk.long(), True)
        allowed = (causal & selected).unsqueeze(1)
        mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
        return original_forward(hidden_states, attention_mask=mask, cache=cache, **kwargs)

    attention.forward = forward
