"""The kernel set of a DCP rank: the attention and indexer families swapped for their DCP forms.

With ``dcp == 1`` nothing changes (the kernel set is returned as it is). With ``dcp > 1`` each rank
keeps only its shard of the MLA cache (latents and index keys), so attention runs through a paged
``(out, lse)`` kernel merged by LSE (``DcpAttention``) and the indexer through a paged scores kernel
and the exact distributed top-k (``DcpIndexer``). The kernels follow the family's backend name:
``reference`` the float32 oracles (``kernels/*/paged_naive.py``), ``triton`` the library's.
KDA, MoE and sampling are untouched: KDA state is not split by DCP (it is split by heads under TP).

Batch-invariant mode is refused with ``dcp > 1`` (``check_dcp_numerics``).
"""

import dataclasses

from kernels.dsa import paged_naive as indexer_reference
from kernels.mla import lse_merge as merge_reference
from kernels.mla import paged_naive as attention_reference
from services.engine.model.backends import KernelSet

from .context import ParallelContext
from .dcp_attention import DcpAttention
from .dcp_indexer import DcpIndexer
from .dcp_shard import DcpShard, check_dcp_numerics


def dcp_kernel_set(
    kernels: KernelSet, context: ParallelContext, batch_invariant: bool, candidates: int | None = None
) -> KernelSet:
    """``kernels`` with attention and indexer over this rank's shard (unchanged at ``dcp == 1``).

    Args:
        kernels: the rank's kernel set (``build_kernels``).
        context: the rank's parallel context (its DCP degree, coordinate and group).
        batch_invariant: whether the model runs the batch-invariant numerics.
        candidates: the distributed top-k's first-round candidates (None: its default).

    Raises:
        ValueError: ``dcp > 1`` with batch-invariant numerics (``check_dcp_numerics``).
    """
    if context.layout.dcp == 1:
        return kernels
    check_dcp_numerics(context.layout.dcp, batch_invariant)
    shard, group = DcpShard(context.coordinates.dcp, context.layout.dcp), context.dcp_group
    if kernels.attention.kind == "triton":
        from kernels.mla.lse_merge_triton import merge_by_lse
        from kernels.mla.paged_triton import paged_mla_decode
    else:
        paged_mla_decode, merge_by_lse = attention_reference.paged_mla_decode, merge_reference.merge_by_lse
    if kernels.indexer.kind == "triton":
        from kernels.dsa.paged_triton import paged_indexer_scores
    else:
        paged_indexer_scores = indexer_reference.paged_indexer_scores
    return dataclasses.replace(
        kernels,
        attention=DcpAttention(paged_mla_decode, merge_by_lse, kernels.attention.kind, shard, group),
        indexer=DcpIndexer(paged_indexer_scores, kernels.indexer.kind, shard, group, candidates),
    )
