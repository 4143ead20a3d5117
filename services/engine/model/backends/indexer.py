"""DSA lightning-indexer backends: each new row's top-k cached positions.

Selection rule (both backends): the ``min(topk, visible)`` highest scores among the row's visible
positions (causal), ties to the lower position; the result is ``[N, topk] int32`` positions, padded
with -1. ``reference`` scores one sequence at a time; ``triton`` runs ``paged_indexer_topk`` over
the packed index keys of every sequence at once.
"""

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from ..layer_cache import MlaLayerCache
from ..numerics import Numerics
from ..step_metadata import StepMetadata


class IndexerBackend(ABC):
    """Top-k selection over cached index keys; ``graph_safe`` as for attention."""

    kind: str  # the backend name this implementation belongs to
    graph_safe: bool

    @abstractmethod
    def topk(
        self,
        q: torch.Tensor,
        weights: torch.Tensor,
        cache: MlaLayerCache,
        meta: StepMetadata,
        topk: int,
        scale: float,
    ) -> torch.Tensor:
        """Select, for every new row, the cached positions its MLA attention may read.

        Args:
            q: ``[N, Hi, Di]`` indexer queries (rotated where the family uses RoPE).
            weights: ``[N, Hi]`` float32 per-head weights.
            cache: the layer's cache (index keys already written for this step's rows).
            meta: the step.
            topk: the budget.
            scale: dot-product scale.

        Returns:
            ``[N, topk] int32`` positions, best first, -1 padded.
        """


class ReferenceIndexer(IndexerBackend):
    """Per sequence: ``Numerics.indexer_scores`` over the gathered keys, then a stable sort."""

    kind = "reference"
    graph_safe = False

    def __init__(self, nx: Numerics):
        self.nx = nx

    def topk(self, q, weights, cache, meta, topk, scale):
        out = torch.full((q.shape[0], topk), -1, dtype=torch.int32, device=q.device)
        for seq in range(meta.num_seqs):
            rows, past, total = meta.rows(seq), meta.past_lens_host[seq], meta.seq_len(seq)
            _, _, keys = cache.gather(meta.block_tables_host[seq], total)
            scores = self.nx.indexer_scores(q[rows], keys, weights[rows], scale)
            query_pos = torch.arange(past, total, device=q.device)
            visible = torch.arange(total, device=q.device)[None, :] <= query_pos[:, None]
            masked = scores.masked_fill(~visible, float("-inf"))
            order = torch.sort(masked, dim=-1, descending=True, stable=True).indices[:, :topk]
            picked = torch.where(visible.gather(1, order), order, -1)
            out[rows, : picked.shape[1]] = picked.to(torch.int32)
        return out


class TritonIndexer(IndexerBackend):
    """``paged_indexer_topk`` over the packed index keys (signature in ``triton_kernels``)."""

    kind = "triton"
    graph_safe = True

    def __init__(self, paged_indexer_topk: Callable):
        self.paged_indexer_topk = paged_indexer_topk

    def topk(self, q, weights, cache, meta, topk, scale):
        return self.paged_indexer_topk(
            q,
            weights,
            cache.index_cache,
            meta.block_tables,
            meta.query_seq,
            meta.positions,
            topk,
            scale,
            meta.max_seq_len,
        )
