"""A forward split into its parts, so parallel drivers (PCP, PP) can run some layers of a step at a time.

``CausalLM.forward_step`` is ``final_logits(run_layers(embed(...)))`` over every layer; a pipeline
stage runs ``run_layers`` over its own layers only, a PCP rank runs all of them on its rows with its
own cache and kernel set. The same modules and numerics, so the single-process bits are kept.
LoRA adapters are not threaded through here (parallel prefill with adapters is refused by the drivers).
"""

import torch

from services.engine.model.backends import KernelSet
from services.engine.model.causal_lm import CausalLM
from services.engine.model.layer_cache import ModelCache
from services.engine.model.step_metadata import StepMetadata


def rotary_tables(model: CausalLM, meta: StepMetadata, dtype: torch.dtype):
    """``(cos, sin)`` ``[N, Dr / 2]`` at the step's positions, or ``(None, None)`` for NoPE."""
    if model.rotary is None:
        return None, None
    return model.rotary.cos_sin(meta.positions, dtype, model.numerics)


def embed(model: CausalLM, meta: StepMetadata) -> torch.Tensor:
    """``[N, D]`` embeddings of the step's tokens (the first stage's input)."""
    return model.model.embed_tokens(meta.input_ids)


def run_layers(
    model: CausalLM,
    hidden: torch.Tensor,
    meta: StepMetadata,
    cache: ModelCache,
    layers: range,
    ops: KernelSet | None = None,
) -> torch.Tensor:
    """Run decoder layers ``layers`` (global indices, in order) over ``hidden [N, D]``.

    Args:
        model: the model (only ``layers`` are read).
        hidden: the residual stream entering ``layers.start``.
        meta: the step.
        cache: the caches of at least ``layers``.
        layers: which layers.
        ops: the kernel set (default: the model's).

    Returns:
        ``[N, D]`` the residual stream after ``layers.stop - 1``.
    """
    nx, ops = model.numerics, ops or model.kernels
    cos, sin = rotary_tables(model, meta, hidden.dtype)
    for index in layers:
        hidden = model.model.layers[index](hidden, cos, sin, meta, cache, index, nx, ops, None)
    return hidden


def final_logits(model: CausalLM, hidden: torch.Tensor) -> torch.Tensor:
    """``[R, vocab]`` logits of the rows ``hidden [R, D]`` (final norm and LM head)."""
    nx = model.numerics
    return nx.linear(model.model.norm(hidden, nx), model.lm_head.weight)
