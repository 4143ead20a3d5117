"""The pretraining losses over token windows: the served model's own forward, default numerics, autograd.

``trajectory_logprobs`` (the RL path) runs the batch-invariant numerics so that log-probs have the
served bits; pretraining needs no bits, only speed, so this path runs ``CausalLM.forward_step`` with
the model's default ``Numerics`` (library GEMMs, expanded MLA, chunked KDA) over one packed step of
fresh sequences and the same ``TrainingCache``. Each window is one sequence; the logits of every row
but its last predict the next token. Any default-numerics backend runs it; ``use_window_kernels``
(``window_kernels.py``) gives the model backends that run all windows at once, which
``trainer.pretrain`` uses. ``tests/trainer/test_window_loss.py`` checks the loss against the
invariant path's log-probs (``include_prompt=True``).

Backward: plain autograd through the same ops, with the same constants as the RL path
(``docs/trainer.md``): the DSA selection and the MoE choices are not differentiated, so the lightning
indexer and ``e_score_correction_bias`` get no gradient and keep their initial values.
"""

import torch

from services.engine.model.causal_lm import CausalLM
from services.engine.model.step_metadata import SequenceStep, build_step_metadata

from .training_cache import TrainingCache


def window_logits(model: CausalLM, windows: torch.Tensor) -> torch.Tensor:
    """Next-token logits of every window position but the last, differentiably.

    Args:
        model: a model in its default numerics (``set_batch_invariant(False)``, the loader's default).
        windows: ``[B, T] int64`` token ids, ``T >= 2``, each window one fresh sequence.

    Returns:
        ``[B * (T - 1), V]`` logits in the model dtype; row ``b * (T - 1) + t`` predicts
        ``windows[b, t + 1]``.

    Raises:
        ValueError: the model is batch-invariant (use ``trajectory_logprobs``), or ``windows`` is not
            ``[B, T]`` with ``T >= 2``.
    """
    if model.numerics.batch_invariant:
        raise ValueError("model: window_logits runs the default numerics; call set_batch_invariant(False)")
    if windows.dim() != 2 or windows.shape[1] < 2:
        raise ValueError(f"windows: expected [batch, tokens >= 2], got {list(windows.shape)}")
    count, length = windows.shape
    model.check_ids(windows.reshape(-1))
    steps = [SequenceStep(tuple(row), 0, (i,), i) for i, row in enumerate(windows.tolist())]
    rows = [i * length + t for i in range(count) for t in range(length - 1)]
    device = model.lm_head.weight.device
    meta = build_step_metadata(steps, length, device, logit_rows=rows, index_topk=model.index_topk)
    cu_seqlens = tuple(i * length for i in range(count + 1))
    return model.forward_step(meta, TrainingCache(cu_seqlens, model.dtype))


def next_token_targets(windows: torch.Tensor) -> torch.Tensor:
    """``[B * (T - 1)]`` the tokens ``window_logits``' rows predict."""
    return windows[:, 1:].reshape(-1)


def language_model_loss(model: CausalLM, windows: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) over every position of ``windows`` but the last, float32."""
    logits = window_logits(model, windows).float()
    return torch.nn.functional.cross_entropy(logits, next_token_targets(windows).to(logits.device))


def distillation_loss(draft_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """Mean over rows of ``KL(target || draft)`` (nats), both ``[R, V]`` logits of the same rows, float32.

    Zero exactly when the draft's next-token distribution is the target's; gradients reach only
    ``draft_logits`` (the target's are detached).
    """
    if draft_logits.shape != target_logits.shape:
        raise ValueError(
            f"--distill-from: the target's logits {list(target_logits.shape)} do not match the draft's "
            f"{list(draft_logits.shape)} (the two models need the same tokenizer)"
        )
    draft = torch.log_softmax(draft_logits.float(), dim=-1)
    target = torch.log_softmax(target_logits.detach().float(), dim=-1)
    return torch.nn.functional.kl_div(draft, target, log_target=True, reduction="batchmean")
