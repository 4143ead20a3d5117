"""The kernel set of a DCP rank: the attention and indexer families swapped for their DCP forms.

With ``dcp == 1`` nothing changes (the kernel set is returned as it is). With ``dcp > 1`` each rank
keeps only its shard of the MLA cache (latents and index keys), so attention runs through a paged
``(out, lse)`` kernel merged by LSE (``DcpAttention``) and the indexer through a paged scores kernel
and the exact distributed top-k (``DcpIndexer``). The kernels follow the family's backend name:
``reference`` the float32 oracles (``kernels/*/paged_naive.py``), ``triton`` the library's.
KDA, MoE and sampling are untouched: KDA state is not split by DCP (it is split by heads under TP).

Batch-invariant mode is refused with ``dcp > 1``: the LSE merge adds each rank's keys separately, a
different reduction order over the keys than one rank's, so DCP 2 would not give DCP 1's bits
(docs/performance.md, "Parallel layouts", says what it would take).
"""

import dataclasses

import torch.distributed as dist

from kernels.dsa import paged_naive as indexer_reference
from kernels.mla import paged_naive as attention_reference
from services.engine.model.backends import KernelSet

from .dcp_attention import DcpAttention
from .dcp_indexer import DcpIndexer
from .dcp_shard import DcpShard


def dcp_kernel_set(
    kernels: KernelSet,
    shard: DcpShard,
    group: dist.ProcessGroup | None,
    batch_invariant: bool,
    candidates: int | None = None,
) -> KernelSet:
    """``kernels`` with attention and indexer over this rank's shard (unchanged at ``shard.size == 1``).

    Args:
        kernels: the rank's kernel set (``build_kernels``).
        shard: the rank's place in its DCP group.
        group: the DCP process group.
        batch_invariant: whether the model runs the batch-invariant numerics.
        candidates: the distributed top-k's first-round candidates (None: its default).

    Raises:
        ValueError: ``dcp > 1`` with batch-invariant numerics.
    """
    if shard.size == 1:
        return kernels
    if batch_invariant:
        raise ValueError(
            f"--dcp {shard.size} with --batch-invariant: the LSE merge of per-rank attention changes the "
            "reduction order over keys, so DCP is not bitwise equal to one rank; run batch-invariant "
            "serving with --dcp 1"
        )
    if kernels.attention.kind == "triton":
        from kernels.mla.paged_triton import paged_mla_decode
    else:
        paged_mla_decode = attention_reference.paged_mla_decode
    if kernels.indexer.kind == "triton":
        from kernels.dsa.paged_triton import paged_indexer_scores
    else:
        paged_indexer_scores = indexer_reference.paged_indexer_scores
    return dataclasses.replace(
        kernels,
        attention=DcpAttention(paged_mla_decode, kernels.attention.kind, shard, group),
        indexer=DcpIndexer(paged_indexer_scores, kernels.indexer.kind, shard, group, candidates),
    )
