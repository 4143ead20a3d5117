"""MLA attention under decode context parallelism: each rank attends its shard of the cache, the
ranks all-gather ``(out, lse)`` and merge by LSE (``kernels.mla.lse_merge``).

Every rank computes the queries of every row (the weights are replicated across the DCP group), writes
only the new tokens it owns (``DcpShard``), and attends each row to its own tokens: the paged kernel
sees the rank's local positions as an ordinary sequence (dense: up to the row's last local position;
DSA: the selected positions it holds). The partials are merged in rank order from the same gathered
bytes, so every rank ends with the same bits. The merge runs in the latent space (``[T, H, Dc]``);
``W_UV`` is applied once, after it.
"""

from collections.abc import Callable

import torch
import torch.distributed as dist

from services.engine.model.backends.attention import AttentionBackend, split_kv_b

from .collectives import all_gather_cat
from .dcp_shard import DcpShard


class DcpAttention(AttentionBackend):
    """Absorbed MLA over this rank's tokens through a paged ``(out, lse)`` kernel, merged over the group.

    Args:
        paged_mla_decode: the kernel (``kernels.mla.paged_naive`` or ``paged_triton``'s signature).
        merge_by_lse: the merge of the gathered partials (``kernels.mla.lse_merge`` or
            ``lse_merge_triton``'s signature).
        kind: the backend name the kernels belong to (``reference`` or ``triton``).
        shard: this rank's place in the DCP group.
        group: the DCP process group (``ParallelContext.dcp_group``).
    """

    graph_safe = False  # the write selects the owned rows with a host-sized index

    def __init__(
        self,
        paged_mla_decode: Callable,
        merge_by_lse: Callable,
        kind: str,
        shard: DcpShard,
        group: dist.ProcessGroup,
    ):
        self.paged_mla_decode = paged_mla_decode
        self.merge_by_lse = merge_by_lse
        self.kind = kind
        self.shard = shard
        self.group = group

    def write(self, cache, meta, latent, k_rope, index_keys):
        """Store only the new rows this rank owns, at its local slots (``DcpShard.local_slots``)."""
        owned, local = self.shard.local_slots(meta.slot_mapping, meta.block_size)
        rows = owned.nonzero().flatten()
        keys = None if index_keys is None else index_keys[rows]
        cache.write(local[rows], latent[rows], k_rope[rows], keys)

    def forward(self, q_nope, q_rope, w_kv_b, cache, meta, topk_positions, scale):
        w_uk, w_uv = split_kv_b(w_kv_b, q_nope.shape[1], q_nope.shape[2])
        q_latent = torch.einsum("thd,hdc->thc", q_nope, w_uk)
        latent, rope = (cache.latent_fp8, None) if cache.is_fp8 else (cache.latent, cache.k_rope)
        selection = None if topk_positions is None else self.shard.local_selection(topk_positions)
        out, lse = self.paged_mla_decode(
            q_latent,
            q_rope,
            latent,
            rope,
            meta.block_tables,
            meta.query_seq,
            self.shard.last_local_position(meta.positions),
            selection,
            scale,
            self.shard.local_bound(meta.max_seq_len),
        )
        outs = all_gather_cat(out[None], self.group)  # [R, T, H, Dc] in rank order
        lses = all_gather_cat(lse[None], self.group)
        merged, _ = self.merge_by_lse(outs, lses)
        return torch.einsum("thc,hdc->thd", merged.to(q_nope.dtype), w_uv)
