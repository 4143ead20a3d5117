"""Batch-invariant float32 ops: every per-token result is bitwise identical whatever else is in the batch.

Library kernels are not batch-invariant (DESIGN.md section 4): MKL sgemm picks its kernel by row
count, ATen's unary kernels round the SIMD tail differently from the body, and library reductions
change order with shape and threads. The ``batch_invariant`` mode builds on these instead:

* ``reduce``: ``tree_sum``, a fixed pairwise order, invariant to trailing zero padding.
* ``elementwise``: ``fixed_elementwise`` and ``fixed_exp/log/sigmoid/silu/softplus``, fixed-size
  blocks so every element takes the same SIMD path.
* ``linear``: ``fixed_linear`` (rows padded to ``TILE_ROWS``, empirical, with a probe
  ``fixed_linear_is_invariant``) and ``tree_linear`` (by construction).
* ``norm``: RMSNorm, gated RMSNorm, L2 normalisation, LayerNorm on top of the above.
* ``attention``: masked softmax and the weighted sum of values, invariant to masked key padding.
"""

from kernels.invariant.attention import invariant_softmax, invariant_weighted_sum
from kernels.invariant.elementwise import (
    ELEMENTWISE_BLOCK,
    fixed_elementwise,
    fixed_exp,
    fixed_log,
    fixed_sigmoid,
    fixed_silu,
    fixed_softplus,
)
from kernels.invariant.linear import TILE_ROWS, fixed_linear, fixed_linear_is_invariant, tree_linear
from kernels.invariant.norm import (
    invariant_gated_rms_norm,
    invariant_l2_normalize,
    invariant_layer_norm,
    invariant_rms_norm,
)
from kernels.invariant.reduce import tree_sum

__all__ = [
    "ELEMENTWISE_BLOCK",
    "TILE_ROWS",
    "fixed_elementwise",
    "fixed_exp",
    "fixed_linear",
    "fixed_linear_is_invariant",
    "fixed_log",
    "fixed_sigmoid",
    "fixed_silu",
    "fixed_softplus",
    "invariant_gated_rms_norm",
    "invariant_l2_normalize",
    "invariant_layer_norm",
    "invariant_rms_norm",
    "invariant_softmax",
    "invariant_weighted_sum",
    "tree_linear",
    "tree_sum",
]
