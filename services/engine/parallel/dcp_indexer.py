"""The DSA indexer under decode context parallelism: each rank scores the index keys it holds, and
the ranks agree on the exact global top-k (``distributed_topk``)."""

from collections.abc import Callable

import torch.distributed as dist

from services.engine.model.backends.indexer import IndexerBackend

from .dcp_shard import DcpShard
from .distributed_topk import ExchangeStats, distributed_topk


class DcpIndexer(IndexerBackend):
    """Scores over this rank's keys through a paged scores kernel, then the distributed top-k.

    Args:
        paged_indexer_scores: the kernel (``kernels.dsa.paged_naive`` or ``paged_triton``'s signature).
        kind: the backend name the kernel belongs to.
        shard: this rank's place in the DCP group.
        group: the DCP process group.
        candidates: what each rank sends in the first round (None: ``default_candidates``).

    Attributes:
        stats: the exchanges' rounds, bytes and refills, summed over every call (all layers, all steps).
    """

    graph_safe = False  # a refill is decided on the host

    def __init__(
        self,
        paged_indexer_scores: Callable,
        kind: str,
        shard: DcpShard,
        group: dist.ProcessGroup,
        candidates: int | None = None,
    ):
        self.paged_indexer_scores = paged_indexer_scores
        self.kind = kind
        self.shard = shard
        self.group = group
        self.candidates = candidates
        self.stats = ExchangeStats()

    def topk(self, q, weights, cache, meta, topk, scale):
        scores = self.paged_indexer_scores(
            q,
            weights,
            cache.index_cache,
            meta.block_tables,
            meta.query_seq,
            self.shard.last_local_position(meta.positions),
            scale,
            self.shard.local_bound(meta.max_seq_len),
        )
        return distributed_topk(scores, self.shard, self.group, topk, self.candidates, self.stats)
