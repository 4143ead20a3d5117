"""The DSA lightning indexer module: picks the keys each query's MLA attention may read."""

import torch
from torch import nn

from kernels.dsa.naive import indexer_topk
from kernels.rotary.naive import apply_rope_half

from .config import IndexerConfig
from .norm import LayerNorm
from .numerics import Numerics


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
        self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None, nx: Numerics
    ) -> torch.Tensor:
        """Keys to cache for new tokens: ``[N, Di]`` from ``x [N, D]`` (tables ``[N, Dr / 2]``)."""
        keys = self.k_norm(nx.linear(x, self.wk.weight), nx)
        return self._rotate(keys, cos, sin)

    def select(
        self,
        x: torch.Tensor,
        query_input: torch.Tensor,
        keys: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        visible: torch.Tensor,
        nx: Numerics,
    ) -> torch.Tensor:
        """Boolean ``[T, S]`` mask of the keys each of one sequence's new queries may attend to.

        Args:
            x: ``[T, D]`` normalised hidden states of the sequence's new tokens.
            query_input: ``[T, q_in]`` compressed query (or ``x``).
            keys: ``[S, Di]`` index keys of all the sequence's tokens, new ones included.
            cos, sin: ``[T, Dr / 2]`` tables of the new tokens, or None for NoPE.
            visible: ``[T, S]`` causal mask.
            nx: numerics.
        """
        seq_len = x.shape[0]
        q = nx.linear(query_input, self.wq_b.weight).view(seq_len, self.spec.n_heads, self.spec.head_dim)
        q = self._rotate(
            q, None if cos is None else cos.unsqueeze(1), None if sin is None else sin.unsqueeze(1)
        )
        weights = nx.linear(x.float(), self.weights_proj.weight.float()) * self.spec.n_heads**-0.5
        scores = nx.indexer_scores(q, keys, weights, self.spec.head_dim**-0.5)
        return indexer_topk(scores[None], visible[None], self.spec.topk)[0]

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
        if cos is None or self.rope_dim == 0:
            return x
        rotated = apply_rope_half(x[..., : self.rope_dim], cos, sin)
        return torch.cat([rotated, x[..., self.rope_dim :]], dim=-1)
