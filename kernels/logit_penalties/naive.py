"""Logit bias and OpenAI / vLLM penalties, the float32 reference: one row at a time, token by token.

For one ``[V]`` logits row, in vLLM's order::

    x[t] += bias[t]                                    for t in logit_bias
    x[t] = x[t] / r if x[t] > 0 else x[t] * r          for t in prompt ∪ output   (repetition r)
    x[t] -= f * count_out(t)                           for t in output            (frequency f)
    x[t] -= p                                          for t in output            (presence p)

Every operation is one float32 operation per element (parameters rounded to float32 first), so the
batched form (``batched.py``) equals this bitwise. Rows are independent.
"""

from collections import Counter

import torch


def penalize_row(
    row: torch.Tensor,
    prompt_ids: list[int],
    output_ids: list[int],
    logit_bias: list[tuple[int, float]],
    presence: float,
    frequency: float,
    repetition: float,
) -> torch.Tensor:
    """One row processed (the module docstring's rules).

    Args:
        row: ``[V]`` logits, any float dtype.
        prompt_ids: the request's prompt tokens (repetition only).
        output_ids: the tokens it generated so far (repetition, frequency, presence).
        logit_bias: ``(token id, bias)`` pairs, ids distinct and in ``[0, V)``.
        presence, frequency: subtracted per distinct / per occurrence output token; 0 = off.
        repetition: > 0, 1 = off.

    Returns:
        ``[V]`` float32, a new tensor.
    """
    x = row.to(torch.float32).clone()

    def f32(value: float) -> torch.Tensor:
        return torch.tensor(value, dtype=torch.float32)

    for token, bias in logit_bias:
        x[token] = x[token] + f32(bias)
    r = f32(repetition)
    for token in sorted(set(prompt_ids) | set(output_ids)):
        x[token] = x[token] / r if x[token] > 0 else x[token] * r
    for token, count in sorted(Counter(output_ids).items()):
        x[token] = x[token] - f32(frequency) * f32(count)
        x[token] = x[token] - f32(presence)
    return x


def penalize_batch(
    logits: torch.Tensor,
    token_rows: torch.Tensor,
    token_ids: torch.Tensor,
    in_output: torch.Tensor,
    bias_rows: torch.Tensor,
    bias_ids: torch.Tensor,
    bias_values: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    repetition: torch.Tensor,
) -> torch.Tensor:
    """The reference of ``batched.penalize_rows`` over ``batched.token_counts``: ``penalize_row`` per row.

    Args:
        logits: ``[R, V]`` any float dtype.
        token_rows, token_ids, in_output: ``[N]`` int64, int64, bool: token ``token_ids[n]`` was
            seen by row ``token_rows[n]``, in its output when ``in_output[n]`` (else its prompt);
            repeats are repeats (they count for frequency).
        bias_rows, bias_ids, bias_values: ``[M]`` int64, int64, float32: ``logit_bias`` entries,
            ``(row, id)`` distinct.
        presence, frequency, repetition: ``[R]`` float32.

    Returns:
        ``[R, V]`` float32.
    """
    rows = []
    for i in range(logits.shape[0]):
        mine = token_rows == i
        ids, out = token_ids[mine].tolist(), in_output[mine].tolist()
        prompt = [t for t, o in zip(ids, out, strict=True) if not o]
        output = [t for t, o in zip(ids, out, strict=True) if o]
        biased = bias_rows == i
        bias = list(zip(bias_ids[biased].tolist(), bias_values[biased].tolist(), strict=True))
        params = (float(presence[i]), float(frequency[i]), float(repetition[i]))
        rows.append(penalize_row(logits[i], prompt, output, bias, *params))
    return torch.stack(rows) if rows else logits.to(torch.float32).clone()
