"""The DSA lightning indexer module: picks the keys each query's MLA attention may read."""

import torch
from torch import nn

from kernels.rotary.naive import apply_rope_half
from services.engine.adapters.step_lora import StepLora, project

from .backends import KernelSet
from .config import IndexerConfig
from .layer_cache import MlaLayerCache
from .norm import LayerNorm
from .numerics import Numerics
from .step_metadata import StepMetadata


class LightningIndexer(nn.Module):
    """Scores past tokens with ``n_heads`` small ReLU heads and keeps the top-k (DeepSeek-V3.2 DSA).

    Args:
        spec: head count, head dim and top-k budget.
        hidden_size: model width (input of ``wk`` and ``weights_proj``).
        query_input_dim: width of the query input: ``q_lora_rank`` when queries are compressed, else
            ``hidden_size`` (the K3 hybrid without a query LoRA).
        rope_dim: leading channels of each head that are rotated (0 for NoPE).
    """

    def __init__(self, spec: IndexerConfig, hidden_size: int, query_input_dim: int, rope_dim: int):
        super().__init__()
        self.spec = spec
        self.rope_dim = rope_dim
        self.wq_b = nn.Linear(query_input_dim, spec.n_heads * spec.head_dim, bias=False)
        self.wk = nn.Linear(hidden_size, spec.head_dim, bias=False)
        self.k_norm = LayerNorm(spec.head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(hidden_size, spec.n_heads, bias=False)

    def index_keys(
        self,
        x: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        nx: Numerics,
        lora: StepLora | None = None,
    ) -> torch.Tensor:
        """Keys to cache for new tokens: ``[N, Di]`` from ``x [N, D]`` (tables ``[N, Dr / 2]``)."""
        keys = self.k_norm(project(x, self.wk, nx, lora), nx)
        return self._rotate(keys, cos, sin)

    def select(
        self,
        x: torch.Tensor,
        query_input: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        cache: MlaLayerCache,
        meta: StepMetadata,
        nx: Numerics,
        ops: KernelSet,
        lora: StepLora | None = None,
    ) -> torch.Tensor:
        """The cached positions each new row's MLA attention may read.

        Args:
            x: ``[N, D]`` normalised hidden states of the step's new tokens.
            query_input: ``[N, q_in]`` compressed query (or ``x``).
            cos, sin: ``[N, Dr / 2]`` tables of the new tokens, or None for NoPE.
            cache: the layer's cache, this step's index keys already written.
            meta: the step.
            nx: numerics of the projections; ops: the indexer backend; lora: the step's adapters.

        Returns:
            ``[N, topk] int32`` positions, -1 padded.
        """
        q = project(query_input, self.wq_b, nx, lora).view(-1, self.spec.n_heads, self.spec.head_dim)
        q = self._rotate(
            q, None if cos is None else cos.unsqueeze(1), None if sin is None else sin.unsqueeze(1)
        )
        # weights_proj is a float32 parameter (FLOAT32_PARAMETERS): the product runs in float32.
        weights = project(x.float(), self.weights_proj, nx, lora) * self.spec.n_heads**-0.5
        return ops.indexer.topk(q, weights, cache, meta, self.spec.topk, self.spec.head_dim**-0.5)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
        if cos is None or self.rope_dim == 0:
            return x
        rotated = apply_rope_half(x[..., : self.rope_dim], cos, sin)
        return torch.cat([rotated, x[..., self.rope_dim :]], dim=-1)
