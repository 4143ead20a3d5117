"""Logit bias and penalties for a batch of rows in a few torch ops on the logits' device.

``token_counts`` turns token lists into the two ``[R, V]`` tables the rules read (each row's output
counts and the tokens it has seen, prompt and output); ``penalize_rows`` applies bias, repetition,
frequency and presence from them. Together they equal ``kernels.logit_penalties.naive.penalize_batch``
bitwise: each output element is the same chain of float32 operations (a token a rule does not touch
gets ``x - 0``, or ``x / 1``), the counts are exact small integers whatever order they were added in,
and no op reduces across a row, so a row's result never depends on the other rows (batch invariance).
The engine keeps the tables per request and adds each step's new tokens (``services/engine/sampling/
penalties.py``), so a step costs no host work in the sequence's length.
"""

import torch


def token_counts(
    rows: int, vocab: int, token_rows: torch.Tensor, token_ids: torch.Tensor, in_output: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(counts, seen)``: ``[rows, vocab]`` float32 output counts and bool "in the prompt or the output".

    Args:
        token_rows, token_ids, in_output: ``[N]`` int64, int64, bool (prompt and output tokens of
            each row, repeats included), on the device the tables are made on.
    """
    counts = torch.zeros(rows, vocab, dtype=torch.float32, device=token_ids.device)
    ones = torch.ones(token_ids.shape[0], dtype=torch.float32, device=token_ids.device)
    counts.index_put_((token_rows, token_ids), torch.where(in_output, ones, 0.0), accumulate=True)
    seen = torch.zeros(rows, vocab, dtype=torch.bool, device=token_ids.device)
    seen[token_rows, token_ids] = True
    return counts, seen


def penalize_rows(
    logits: torch.Tensor,
    counts: torch.Tensor,
    seen: torch.Tensor,
    bias_rows: torch.Tensor,
    bias_ids: torch.Tensor,
    bias_values: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    repetition: torch.Tensor,
) -> torch.Tensor:
    """Apply bias, repetition, frequency and presence to ``R`` rows at once.

    Args:
        logits: ``[R, V]`` any float dtype.
        counts, seen: ``[R, V]`` float32 output counts and bool prompt-or-output (``token_counts``).
        bias_rows, bias_ids, bias_values: ``[M]`` int64, int64, float32 (distinct ``(row, id)``).
        presence, frequency, repetition: ``[R]`` float32 (0, 0, 1 = off).

    Returns:
        ``[R, V]`` float32, a new tensor.
    """
    x = logits.to(torch.float32, copy=True)
    if bias_ids.numel():
        x[bias_rows, bias_ids] = x[bias_rows, bias_ids] + bias_values
    r = repetition[:, None]
    x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
    x = x - frequency[:, None] * counts
    return x - presence[:, None] * (counts > 0).to(torch.float32)
