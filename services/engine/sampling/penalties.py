"""A step's logit bias and penalties: the rows whose requests ask for them, processed on the device
before sampling (``kernels.logit_penalties``); the other rows are not touched and cost nothing.

The sampler then samples from, and reports logprobs of, the processed rows (before temperature):
vLLM v0's "processed logprobs". A migrated request's resumed tokens (the prompt's last
``num_resumed``) were its output elsewhere, so they count as output here too.

Speculative decoding does not draft for these requests (``Scheduler.draftable``): the penalties of
a verify position would depend on the drafts before it, so they always decode one token a step.
"""

import torch

from kernels.logit_penalties.batched import penalize_batch

from ..request import Request


def apply_penalties(logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
    """``logits [B, V]`` with row ``i`` processed by ``requests[i]``'s bias and penalties.

    Returns ``logits`` itself when no request asks for any; else a new float32 ``[B, V]`` tensor
    (rows without them converted unchanged, so they sample as before).
    """
    chosen = [i for i, request in enumerate(requests) if request.params.processes_logits]
    if not chosen:
        return logits
    device = logits.device
    token_rows: list[int] = []
    token_ids: list[int] = []
    in_output: list[bool] = []
    bias_rows: list[int] = []
    bias_ids: list[int] = []
    bias_values: list[float] = []
    for row, i in enumerate(chosen):
        request = requests[i]
        split = len(request.prompt_ids) - request.num_resumed
        tokens = request.prompt_ids + request.output_ids
        token_rows += [row] * len(tokens)
        token_ids += tokens
        in_output += [False] * split + [True] * (len(tokens) - split)
        for token, bias in request.params.logit_bias:
            bias_rows.append(row)
            bias_ids.append(token)
            bias_values.append(bias)
    params = [requests[i].params for i in chosen]

    def on_device(values: list, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)

    processed = penalize_batch(
        logits[chosen],
        on_device(token_rows, torch.int64),
        on_device(token_ids, torch.int64),
        on_device(in_output, torch.bool),
        on_device(bias_rows, torch.int64),
        on_device(bias_ids, torch.int64),
        on_device(bias_values, torch.float32),
        on_device([p.presence_penalty for p in params], torch.float32),
        on_device([p.frequency_penalty for p in params], torch.float32),
        on_device([p.repetition_penalty for p in params], torch.float32),
    )
    index = torch.tensor(chosen, dtype=torch.int64).to(device, non_blocking=True)
    return logits.to(torch.float32).index_copy(0, index, processed)
