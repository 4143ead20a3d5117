"""Multi-head latent attention layer (optionally DSA-indexed), holding weights in transformers' names."""

import torch
from torch import nn

from kernels.mla.naive import mla_attention_absorbed, mla_attention_expanded
from kernels.rotary.naive import apply_rope_interleaved

from .config import ModelConfig
from .indexer import LightningIndexer
from .norm import RMSNorm
from .state import MlaLayerState, append_tokens


class MultiLatentAttention(nn.Module):
    """MLA: queries (optionally through a LoRA), one shared latent per token, per-head K/V on the fly.

    Prefill (more than one new token) expands K/V per head; a single-token step runs in the absorbed
    latent form, as decode does. With a ``LightningIndexer`` each query attends only to its top-k.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        heads, hidden = config.num_attention_heads, config.hidden_size
        if config.q_lora_rank is None:
            self.q_proj = nn.Linear(hidden, heads * config.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden, config.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(config.q_lora_rank, 1e-6)
            self.q_b_proj = nn.Linear(config.q_lora_rank, heads * config.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, config.kv_lora_rank + config.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(config.kv_lora_rank, 1e-6)
        self.kv_b_proj = nn.Linear(
            config.kv_lora_rank, heads * (config.qk_nope_head_dim + config.v_head_dim), bias=False
        )
        self.o_proj = nn.Linear(heads * config.v_head_dim, hidden, bias=False)
        self.indexer = None
        if config.indexer is not None:
            query_input = config.q_lora_rank or hidden
            rope_dim = config.qk_rope_head_dim if config.rope else 0
            self.indexer = LightningIndexer(config.indexer, hidden, query_input, rope_dim)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        cache: MlaLayerState | None,
        past_tokens: int,
    ) -> tuple[torch.Tensor, MlaLayerState]:
        """Attend the new tokens to the cached ones and themselves.

        Args:
            x: ``[B, T, D]`` normalised hidden states of the new tokens.
            cos, sin: ``[B, T, Dr / 2]`` rotary tables of the new tokens, or None (NoPE).
            cache: this layer's cached tokens, or None at the start of the sequence.
            past_tokens: number of cached tokens (positions of the new tokens start there).

        Returns:
            ``(out [B, T, D], updated cache)``.
        """
        c = self.config
        batch, seq_len, _ = x.shape
        if c.q_lora_rank is None:
            query_input = x
            q = self.q_proj(x)
        else:
            query_input = self.q_a_layernorm(self.q_a_proj(x))
            q = self.q_b_proj(query_input)
        q = q.view(batch, seq_len, c.num_attention_heads, c.qk_head_dim)
        q_nope, q_rope = q[..., : c.qk_nope_head_dim], q[..., c.qk_nope_head_dim :]
        compressed = self.kv_a_proj_with_mqa(x)
        latent = self.kv_a_layernorm(compressed[..., : c.kv_lora_rank])
        k_rope = compressed[..., c.kv_lora_rank :]
        if cos is not None:
            q_rope = apply_rope_interleaved(q_rope, cos.unsqueeze(2), sin.unsqueeze(2))
            k_rope = apply_rope_interleaved(k_rope, cos, sin)

        index_keys = self.indexer.index_keys(x, cos, sin) if self.indexer is not None else None
        cache = MlaLayerState(
            latent=append_tokens(None if cache is None else cache.latent, latent),
            k_rope=append_tokens(None if cache is None else cache.k_rope, k_rope),
            index_keys=None
            if index_keys is None
            else append_tokens(None if cache is None else cache.index_keys, index_keys),
        )
        total = past_tokens + seq_len
        query_pos = torch.arange(past_tokens, total, device=x.device)
        visible = (torch.arange(total, device=x.device)[None, :] <= query_pos[:, None]).expand(batch, -1, -1)
        allowed = visible
        if self.indexer is not None:
            allowed = self.indexer.select(x, query_input, cache.index_keys, cos, sin, visible)
        attend = mla_attention_absorbed if seq_len == 1 and past_tokens > 0 else mla_attention_expanded
        out = attend(
            q_nope, q_rope, cache.latent, cache.k_rope, self.kv_b_proj.weight, c.attention_scale, allowed
        )
        return self.o_proj(out.reshape(batch, seq_len, -1)), cache
