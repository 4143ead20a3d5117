"""Multi-head latent attention layer (optionally DSA-indexed), holding weights in transformers' names."""

import torch
from torch import nn

from kernels.rotary.naive import apply_rope_interleaved
from services.engine.adapters.step_lora import StepLora, project
from services.engine.parallel.context import ParallelContext
from services.engine.parallel.row_parallel import row_parallel_project
from services.engine.parallel.shard import Shard

from .backends import KernelSet
from .config import ModelConfig
from .indexer import LightningIndexer
from .layer_cache import ModelCache
from .norm import RMSNorm
from .numerics import Numerics
from .step_metadata import StepMetadata


class MultiLatentAttention(nn.Module):
    """MLA: queries (optionally through a LoRA), one shared latent per token, per-head K/V on the fly.

    Prefill (more than one new token) expands K/V per head; a single-token step runs in the absorbed
    latent form, as decode does. With a ``LightningIndexer`` each query attends only to its top-k.

    Under TP a rank holds ``heads / tp`` heads: the query and ``kv_b`` projections are column-parallel
    (their rows, head-major), ``o_proj`` row-parallel (summed over the TP group); the latent projection,
    its cache and the indexer are whole on every rank.
    """

    def __init__(self, config: ModelConfig, parallel: ParallelContext):
        super().__init__()
        self.config, self.parallel = config, parallel
        heads, hidden = config.num_attention_heads // parallel.tp, config.hidden_size
        self.local_heads = heads
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
        if parallel.tp > 1:
            column, row = Shard(0, parallel.tp_rank, parallel.tp), Shard(1, parallel.tp_rank, parallel.tp)
            query = "q_proj.weight" if config.q_lora_rank is None else "q_b_proj.weight"
            self.parameter_shards = {query: column, "kv_b_proj.weight": column, "o_proj.weight": row}

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        meta: StepMetadata,
        cache: ModelCache,
        layer: int,
        nx: Numerics,
        ops: KernelSet,
        lora: StepLora | None = None,
    ) -> torch.Tensor:
        """Write the new tokens' latents to the cache (one scatter), then attend every row to its cache.

        Args:
            x: ``[N, D]`` normalised hidden states of the step's new tokens.
            cos, sin: ``[N, Dr / 2]`` rotary tables at the tokens' positions, or None (NoPE).
            meta: the step.
            cache: the model cache; this layer's index is ``layer``.
            nx: numerics of the token-local work.
            ops: the kernel backends (indexer and attention).
            lora: the step's adapters (``services.engine.adapters``), or None.

        Returns:
            ``[N, D]``.
        """
        c = self.config
        tokens = x.shape[0]
        if c.q_lora_rank is None:
            query_input = x
            q = project(x, self.q_proj, nx, lora)
        else:
            query_input = self.q_a_layernorm(project(x, self.q_a_proj, nx, lora), nx)
            q = project(query_input, self.q_b_proj, nx, lora)
        q = q.view(tokens, self.local_heads, c.qk_head_dim)
        q_nope, q_rope = q[..., : c.qk_nope_head_dim], q[..., c.qk_nope_head_dim :]
        compressed = project(x, self.kv_a_proj_with_mqa, nx, lora)
        latent = self.kv_a_layernorm(compressed[..., : c.kv_lora_rank], nx)
        k_rope = compressed[..., c.kv_lora_rank :]
        if cos is not None:
            q_rope = apply_rope_interleaved(q_rope, cos.unsqueeze(1), sin.unsqueeze(1))
            k_rope = apply_rope_interleaved(k_rope, cos, sin)
        layer_cache = cache.mla(layer)
        index_keys = self.indexer.index_keys(x, cos, sin, nx, lora) if self.indexer is not None else None
        layer_cache.write(meta.slot_mapping, latent, k_rope, index_keys)
        topk = None
        if self.indexer is not None:
            topk = self.indexer.select(x, query_input, cos, sin, layer_cache, meta, nx, ops, lora)
        out = ops.attention.forward(
            q_nope, q_rope, self.kv_b_proj.weight, layer_cache, meta, topk, c.attention_scale
        )
        return row_parallel_project(out.reshape(tokens, -1), self.o_proj, nx, lora, self.parallel)
