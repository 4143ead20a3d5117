"""The LoRA merge contract: how an adapter changes one linear's output, written once.

For a linear ``y = x @ W^T`` with a LoRA pair ``A [r, K]``, ``B [M, r]`` and ``scaling``::

    base  = the layer's own product, in the model dtype, bit for bit what the base model computes
    h     = float32(x) @ float32(A)^T          accumulated in float32            [N, r]
    d     = h @ float32(B)^T                   accumulated in float32, h not rounded  [N, M]
    y     = to_model_dtype(float32(base) + scaling * d)      one rounding, at the end

- ``scaling`` is ``lora_alpha / r`` (``lora_alpha / sqrt(r)`` with ``use_rslora``), computed in Python
  float64 and rounded once to float32 when the adapter is loaded (``scaling_of``); it multiplies the
  float32 delta after ``B``, never the weights.
- The adapter's weights are held in float32 whatever their stored dtype (an exact widening).
- The delta is added to the base output, not to the base weights: adapter weights are **never**
  merged into ``W`` (that would change every other request's bits, and rounding ``W + s B A`` to the
  model dtype loses the update). Rows without an adapter never reach this function, so their bits
  are the base model's exactly.
- The two products go through ``Numerics.linear_f32``: library GEMMs in the default mode; in
  batch-invariant mode the fixed-tile / tree products (``kernels/invariant/linear.py``), so a row's
  delta depends only on that row, and the addition and rounding are elementwise. Hence a row's output
  under an adapter is the same whatever else (other adapters, base rows) is in the batch.

Why this order: keeping ``base`` as the base model computes it makes "no adapter" trivially bitwise;
summing in float32 and rounding once loses less than rounding the delta first and adding in bf16;
applying ``scaling`` after ``B`` in float32 is what PEFT's unmerged forward does up to its dtype.
A trainer with autograd calls the same ``lora_output`` (every op in it is differentiable).
"""

import math

import torch

from services.engine.model.numerics import Numerics


def scaling_of(alpha: float, rank: int, use_rslora: bool) -> float:
    """The adapter's scaling as the float32 value the contract multiplies by (returned as a Python
    float that float32 represents exactly)."""
    value = alpha / math.sqrt(rank) if use_rslora else alpha / rank
    return float(torch.tensor(value, dtype=torch.float32))


def lora_output(
    base: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scaling: float,
    nx: Numerics,
) -> torch.Tensor:
    """Apply one LoRA pair to a linear's output (the contract in the module docstring).

    Args:
        base: ``[N, M]`` the base linear's output ``x @ W^T`` in the model dtype (or float32 for the
            float32 projections).
        x: ``[N, K]`` the linear's input.
        lora_a: ``[r, K]`` float32.
        lora_b: ``[M, r]`` float32.
        scaling: from ``scaling_of``.
        nx: the numerics (default or batch-invariant) whose ``linear_f32`` computes the products.

    Returns:
        ``[N, M]`` in ``base.dtype``.
    """
    delta = nx.linear_f32(nx.linear_f32(x, lora_a), lora_b)
    return (base.to(torch.float32) + scaling * delta).to(base.dtype)
