"""Multi-head latent attention layer (optionally DSA-indexed), holding weights in transformers' names."""

import torch
from torch import nn

from kernels.rotary.naive import apply_rope_interleaved

from .config import ModelConfig
from .forward_batch import ForwardBatch, ModelCache
from .indexer import LightningIndexer
from .norm import RMSNorm
from .numerics import Numerics


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
        batch: ForwardBatch,
        cache: ModelCache,
        layer: int,
        nx: Numerics,
    ) -> torch.Tensor:
        """Write the new tokens' latents to the cache and attend each sequence's new tokens to its cache.

        Args:
            x: ``[N, D]`` normalised hidden states of the batch's new tokens.
            cos, sin: ``[N, Dr / 2]`` rotary tables at the tokens' positions, or None (NoPE).
            batch: which rows belong to which sequence, and their past lengths.
            cache: per-sequence cache; this layer's index is ``layer``.
            nx: numerics.

        Returns:
            ``[N, D]``.
        """
        c = self.config
        tokens = x.shape[0]
        if c.q_lora_rank is None:
            query_input = x
            q = nx.linear(x, self.q_proj.weight)
        else:
            query_input = self.q_a_layernorm(nx.linear(x, self.q_a_proj.weight), nx)
            q = nx.linear(query_input, self.q_b_proj.weight)
        q = q.view(tokens, c.num_attention_heads, c.qk_head_dim)
        q_nope, q_rope = q[..., : c.qk_nope_head_dim], q[..., c.qk_nope_head_dim :]
        compressed = nx.linear(x, self.kv_a_proj_with_mqa.weight)
        latent = self.kv_a_layernorm(compressed[..., : c.kv_lora_rank], nx)
        k_rope = compressed[..., c.kv_lora_rank :]
        if cos is not None:
            q_rope = apply_rope_interleaved(q_rope, cos.unsqueeze(1), sin.unsqueeze(1))
            k_rope = apply_rope_interleaved(k_rope, cos, sin)
        index_keys = self.indexer.index_keys(x, cos, sin, nx) if self.indexer is not None else None

        out = x.new_empty(tokens, c.num_attention_heads, c.v_head_dim)
        for seq, piece in enumerate(batch.sequences):
            rows = piece.rows
            new_index = None if index_keys is None else index_keys[rows]
            cache.write_mla(layer, seq, latent[rows], k_rope[rows], new_index)
            cached_latent, cached_rope, cached_index = cache.read_mla(layer, seq)
            query_pos = torch.arange(piece.past, piece.total, device=x.device)
            allowed = torch.arange(piece.total, device=x.device)[None, :] <= query_pos[:, None]
            if self.indexer is not None:
                allowed = self.indexer.select(
                    x[rows], query_input[rows], cached_index, _rows(cos, rows), _rows(sin, rows), allowed, nx
                )
            decoding = piece.length == 1 and piece.past > 0
            out[rows] = nx.mla_attention(
                q_nope[rows],
                q_rope[rows],
                cached_latent,
                cached_rope,
                self.kv_b_proj.weight,
                c.attention_scale,
                allowed,
                decoding,
            )
        return nx.linear(out.reshape(tokens, -1), self.o_proj.weight)


def _rows(table: torch.Tensor | None, rows: slice) -> torch.Tensor | None:
    return None if table is None else table[rows]
