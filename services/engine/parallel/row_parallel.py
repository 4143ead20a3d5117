"""Row-parallel products: the input dim K split across TP ranks, the partial outputs summed.

Default numerics: each rank's ``x_shard @ w_shard^T`` in the model dtype, all-reduced (at TP 1 this is
``nx.linear`` unchanged). Batch-invariant numerics: K is cut into ``INVARIANT_K_SEGMENTS`` equal
segments whatever the degree; a rank computes the float32 partial of each segment it holds
(``InvariantNumerics.segment_products``: one fixed-shape invariant product per segment), the
partials are summed by ``sum_segments`` in segment order, then rounded once to the model dtype.
Every segment's partial and the summation tree are the same at
every degree, so TP 1, 2, 4 and 8 give the same bits::

    K = 8 segments        s0 s1 s2 s3 s4 s5 s6 s7
    TP 1: rank 0 holds    s0 s1 s2 s3 s4 s5 s6 s7
    TP 2: rank 0 / 1      s0 s1 s2 s3 | s4 s5 s6 s7
    out = tree_sum([p0 ... p7]) -> model dtype, identical in both

(A plain local product over a rank's whole K shard would not do: a GEMM's reduction over K is not
a tree whose subtrees are the shards.)
"""

import torch
from torch import nn

from services.engine.adapters.step_lora import StepLora
from services.engine.model.numerics import Numerics

from .collectives import all_reduce_sum, sum_segments
from .context import ParallelContext
from .layout import INVARIANT_K_SEGMENTS


def row_parallel_linear(
    x: torch.Tensor, weight: torch.Tensor, nx: Numerics, parallel: ParallelContext
) -> torch.Tensor:
    """``x @ weight^T`` summed over the TP group.

    Args:
        x: ``[N, K / tp]`` this rank's slice of the input (its heads or intermediate channels).
        weight: ``[M, K / tp]`` this rank's columns of the full ``[M, K]`` weight.
        nx: the numerics.
        parallel: the rank's context (its ``tp_group`` sums the partials).

    Returns:
        ``[N, M]`` in ``x.dtype``, the full product on every TP rank.
    """
    if not nx.batch_invariant:
        return all_reduce_sum(nx.linear(x, weight), parallel.tp_group)
    segments = INVARIANT_K_SEGMENTS // parallel.tp
    if x.shape[-1] % segments:
        raise ValueError(
            f"batch-invariant row-parallel product: width {x.shape[-1] * parallel.tp} is not a multiple "
            f"of {INVARIANT_K_SEGMENTS} segments (ParallelLayout.validate rejects such a model)"
        )
    return sum_segments(nx.segment_products(x, weight, segments), parallel.tp_group).to(x.dtype)


def row_parallel_project(
    x: torch.Tensor, module: nn.Linear, nx: Numerics, lora: StepLora | None, parallel: ParallelContext
) -> torch.Tensor:
    """A row-parallel layer's linear (``row_parallel_linear``), then the step's adapters on their rows
    (``step_lora.project``'s contract; adapters run only at TP 1, where ``module`` is whole)."""
    base = row_parallel_linear(x, module.weight, nx, parallel)
    return base if lora is None else lora.linear(module, x, base, nx)
