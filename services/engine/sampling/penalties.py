"""A step's logit bias and penalties: the rows whose requests ask for them, processed on the device
before sampling (``kernels.logit_penalties``); the other rows are not touched and cost nothing.

Each penalised request keeps its ``TokenCounts`` (``request.token_counts``): its output-token counts
and the tokens it has seen (prompt and output), ``[V]`` each on the logits' device (5 bytes a vocabulary
entry), built from the prompt at its first step and grown by the tokens generated since, so a step's
host work does not grow with the sequence. A migrated request's resumed tokens (the prompt's last
``num_resumed``) were its output elsewhere, so they count as output here too.

The sampler then samples from, and reports logprobs of, the processed rows (before temperature):
vLLM v0's "processed logprobs".

Speculative decoding does not draft for these requests (``Scheduler.draftable``): the penalties of
a verify position would depend on the drafts before it, so they always decode one token a step.
"""

import torch

from kernels.logit_penalties.batched import penalize_rows, token_counts

from ..request import Request


class TokenCounts:
    """One request's output-token counts (float32) and seen tokens (bool), ``[vocab]`` on ``device``:
    built from its prompt by ``token_counts``; ``sync`` adds the output tokens generated since."""

    def __init__(self, request: Request, vocab: int, device: torch.device):
        prompt = torch.tensor(request.prompt_ids, dtype=torch.int64).to(device, non_blocking=True)
        resumed = (
            torch.arange(len(request.prompt_ids), device=device)
            >= len(request.prompt_ids) - request.num_resumed
        )
        counts, seen = token_counts(1, vocab, torch.zeros_like(prompt), prompt, resumed)
        self.counts, self.seen = counts[0], seen[0]
        self.consumed = 0  # of ``request.output_ids``

    def sync(self, request: Request) -> None:
        self._add(request.output_ids[self.consumed :])
        self.consumed = len(request.output_ids)

    def _add(self, tokens: list[int]) -> None:
        if tokens:
            ids = torch.tensor(tokens, dtype=torch.int64).to(self.counts.device, non_blocking=True)
            self.counts.index_put_((ids,), torch.ones_like(ids, dtype=torch.float32), accumulate=True)
            self.seen[ids] = True


def apply_penalties(logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
    """``logits [B, V]`` with row ``i`` processed by ``requests[i]``'s bias and penalties.

    Returns ``logits`` itself when no request asks for any; else a new float32 ``[B, V]`` tensor
    (rows without them converted unchanged, so they sample as before).
    """
    chosen = [i for i, request in enumerate(requests) if request.params.processes_logits]
    if not chosen:
        return logits
    device, vocab = logits.device, logits.shape[1]
    counts, seen, bias_rows, bias_ids, bias_values = [], [], [], [], []
    for row, i in enumerate(chosen):
        request = requests[i]
        if request.token_counts is None:
            request.token_counts = TokenCounts(request, vocab, device)
        request.token_counts.sync(request)
        counts.append(request.token_counts.counts)
        seen.append(request.token_counts.seen)
        for token, bias in request.params.logit_bias:
            bias_rows.append(row)
            bias_ids.append(token)
            bias_values.append(bias)
    params = [requests[i].params for i in chosen]

    def on_device(values: list, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)

    processed = penalize_rows(
        logits[chosen],
        torch.stack(counts),
        torch.stack(seen),
        on_device(bias_rows, torch.int64),
        on_device(bias_ids, torch.int64),
        on_device(bias_values, torch.float32),
        on_device([p.presence_penalty for p in params], torch.float32),
        on_device([p.frequency_penalty for p in params], torch.float32),
        on_device([p.repetition_penalty for p in params], torch.float32),
    )
    index = torch.tensor(chosen, dtype=torch.int64).to(device, non_blocking=True)
    return logits.to(torch.float32).index_copy(0, index, processed)
