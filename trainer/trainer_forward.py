"""The trainer forward: per-token log-probs of served trajectories, bitwise the served ones, with autograd.

Contract (DESIGN.md section 4, ``docs/trainer.md``): for a model in batch-invariant mode, the
log-prob ``trajectory_logprobs`` returns for a generated token has the same float32 bits as the
logprob the engine served for it (``SamplingParams(logprobs=0)``, ``LLM(batch_invariant=True)``),
whatever the packing of the trainer batch and whatever happened on the serving side (batch
composition, chunked prefill or decode, prefix-cache hits, preemption and recompute). It holds by
construction, not by tolerance:

* the forward is the served one: ``CausalLM.forward_step`` with the ``InvariantNumerics`` and the
  ``reference`` backends, every trajectory one fresh sequence of one packed step. MLA runs absorbed,
  each query over its visible (or DSA-selected) keys in position order; KDA runs the CF-BI fixed-chunk
  rows, whose bits do not depend on how tokens were grouped into steps. Only the cache differs
  (``TrainingCache``: the rows the layers computed, not pool copies of them; same values);
* the log-prob is the sampler's: ``log_softmax`` of one float32 logits row at a time
  (``services/engine/sampling/sampler.py``), indexed at the token.

Backward: autograd through the same ops (fixed-tile GEMMs, tree sums, fixed-block elementwise ops,
the CF-BI rows; ``kernels/kda/fixed_chunk.py`` updates its open rows out of place so it can). No op of
this path is a custom kernel, so no surrogate gradient is used. The backward is *not* batch-invariant:
only the forward bits are contracted. Integer choices are constants of the backward:

* DSA top-k: the attention over the selected keys is differentiated, the selection is not, so the
  lightning indexer's parameters (``indexer.wq_b``, ``wk``, ``k_norm``, ``weights_proj``) get no
  gradient from a log-prob loss (DeepSeek-V3.2 trains them with a separate loss; not done here).
  When ``index_topk`` covers every visible key, the indexer has no effect on the output at all.
* MoE routing: the chosen experts are constants; gradients reach the router weight through the
  chosen experts' (renormalised, scaled) sigmoid weights. ``e_score_correction_bias`` only ranks
  experts and gets no gradient (it is moved by load balancing, not by the loss).
"""

from dataclasses import dataclass

import torch

from services.engine.model.causal_lm import CausalLM
from services.engine.model.step_metadata import SequenceStep, build_step_metadata

from .training_cache import TrainingCache
from .trajectory import PackedBatch


@dataclass(frozen=True)
class TrajectoryLogprobs:
    """Log-probs aligned with a packed batch's tokens.

    Attributes:
        batch: the packed batch.
        logprobs: ``[N] float32``, differentiable: at packed position ``p`` the log-prob of token ``p``
            given the trajectory's tokens before it; ``0.0`` where ``scored`` is False.
        scored: ``[N] bool``, positions holding a log-prob (generated tokens, and prompt tokens after
            the first when asked for).
        generated: ``[N] bool``, the generated tokens' positions.
    """

    batch: PackedBatch
    logprobs: torch.Tensor
    scored: torch.Tensor
    generated: torch.Tensor

    def of_generated(self, index: int) -> torch.Tensor:
        """Trajectory ``index``'s generated tokens' log-probs, ``[len(output_ids)]``."""
        return self.logprobs[self.batch.generated_span(index)]


def make_trainable(model: CausalLM) -> CausalLM:
    """Put ``model`` in batch-invariant mode with gradients on every parameter; returns it.

    The engine may serve the same module (``LLM(..., prebuilt=model)``): it runs under ``no_grad``.
    """
    model.set_batch_invariant(True)
    model.requires_grad_(True)
    return model


def trajectory_logprobs(
    model: CausalLM, batch: PackedBatch, include_prompt: bool = False
) -> TrajectoryLogprobs:
    """Recompute the log-probs of ``batch``'s tokens with the served forward numerics, differentiably.

    Args:
        model: a batch-invariant model (``make_trainable``), the weights the tokens were served with.
        batch: the trajectories, packed in any order.
        include_prompt: also score each prompt token after the first.

    Returns:
        ``TrajectoryLogprobs``; a generated token's value has the served logprob's bits.

    Raises:
        ValueError: the model is not in batch-invariant mode, or a token is outside the vocabulary.
    """
    if not model.numerics.batch_invariant or model.kernels.name != "reference":
        raise ValueError(
            "model: the trainer forward reproduces the batch-invariant served forward; "
            "call make_trainable(model) (or model.set_batch_invariant(True)) first"
        )
    device = model.lm_head.weight.device
    ids = batch.input_ids
    input_ids = torch.tensor(ids, dtype=torch.long, device=device)
    model.check_ids(input_ids)
    positions = []  # packed positions of the scored tokens
    generated = torch.zeros(batch.num_tokens, dtype=torch.bool)
    for index in range(len(batch.trajectories)):
        span = batch.generated_span(index)
        generated[span] = True
        first = batch.cu_seqlens[index] + 1 if include_prompt else span.start
        positions.extend(range(first, span.stop))
    rows = [position - 1 for position in positions]  # a token is scored by the logits of the one before
    logprobs = torch.zeros(batch.num_tokens, dtype=torch.float32, device=device)
    scored = torch.zeros(batch.num_tokens, dtype=torch.bool)
    scored[positions] = True
    if positions:
        logits = _logits(model, batch, rows)
        values = torch.stack(
            [_served_logprob(logits[j], ids[position]) for j, position in enumerate(positions)]
        )
        logprobs = logprobs.index_put((torch.tensor(positions, device=device),), values)
    return TrajectoryLogprobs(batch, logprobs, scored.to(device), generated.to(device))


def _logits(model: CausalLM, batch: PackedBatch, rows: list[int]) -> torch.Tensor:
    """``[len(rows), V]`` logits of packed rows ``rows``; trajectory ``i`` is block ``i`` and slot ``i``."""
    # Adapter hook: a trajectory served with a LoRA adapter runs with it here too (its slot in the
    # SequenceStep, the adapter table passed to forward_step); its A/B then get gradients as well.
    steps = [SequenceStep(t.token_ids, 0, (i,), i) for i, t in enumerate(batch.trajectories)]
    block_size = max(len(t) for t in batch.trajectories)  # one block holds a whole trajectory
    meta = build_step_metadata(
        steps, block_size, model.lm_head.weight.device, logit_rows=rows, index_topk=model.index_topk
    )
    return model.forward_step(meta, TrainingCache(batch.cu_seqlens, model.lm_head.weight.dtype))


def _served_logprob(row: torch.Tensor, token: int) -> torch.Tensor:
    """The sampler's logprob of ``token`` from one ``[V]`` logits row (``sampler.sample``: the row in
    float32, contiguous, ``log_softmax`` over it alone, never a batched one)."""
    return torch.log_softmax(row.to(torch.float32).contiguous(), dim=-1)[token]
