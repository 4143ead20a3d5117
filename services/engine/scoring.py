"""Scoring given tokens: the log-probs of a continuation under the engine's model, from one prefill of
prompt + continuation, without generating.

```
 sequence:     p0 p1 p2 | c0 c1 c2          (prompt | continuation to score)
 logit rows:          x    x  x             (row p2 scores c0, c0 scores c1, c1 scores c2)
```
Many sequences share a step (packed up to the engine's token budget; a longer one runs alone), each
on private pools (``ContiguousCache``: the scheduler, the paged pools and the prefix cache are not
touched, so scoring never disturbs requests in flight). The step is ``CausalLM.forward_step`` with
the engine's numerics, kernels and adapter table, and each log-prob is the sampler's
(``raw_logprobs``: one float32 row at a time). In batch-invariant mode a row's bits do not depend on the
step, the chunking or the cache the context came through, so a scored token's log-prob has the bits
the engine reported when it generated that token after the same prompt (``baton mismatch --mode
scorer``).

``score_ranked`` also returns each row's ``top_n`` most likely tokens (a prompt's log-probs with their
alternatives: the decode worker's ``Score`` RPC, OpenAI's ``echo`` with ``logprobs``), taken from the
same float32 row as the scored token (``top_n_logprobs``, the sampler's own), so a scored token that is
also among the alternatives has the same bits in both.
"""

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from services.engine.adapters.lora_adapter import LoraAdapter
from services.engine.cache.contiguous_cache import ContiguousCache
from services.engine.model.causal_lm import CausalLM
from services.engine.model.step_metadata import build_step_metadata
from services.engine.sampling.sampler import raw_logprobs, top_n_logprobs


@dataclass(frozen=True)
class ScoreItem:
    """One sequence to score: its context, the tokens whose log-probs are wanted, its adapter slot."""

    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    adapter: int = 0


@dataclass(frozen=True)
class ScoredToken:
    """One scored token: its log-prob and its row's ``top_n`` most likely ``(token id, log-prob)``
    pairs, value descending then id ascending (empty when ``top_n`` is 0)."""

    logprob: float
    top_logprobs: tuple[tuple[int, float], ...] = ()


def score_tokens(
    model: CausalLM, items: list[ScoreItem], adapters: Mapping[int, LoraAdapter], max_step_tokens: int
) -> list[list[float]]:
    """Each item's continuation log-probs (Python floats holding float32 values), in item order.

    Args:
        model: the engine's model.
        items: the sequences (each ``prompt_ids`` non-empty; ``token_ids`` may be empty).
        adapters: slot -> adapter for every nonzero ``ScoreItem.adapter`` (``AdapterRegistry.table``).
        max_step_tokens: tokens per step; a longer sequence takes a step alone.
    """
    ranked = score_ranked(model, items, adapters, max_step_tokens, 0)
    return [[token.logprob for token in scored] for scored in ranked]


@torch.no_grad()
def score_ranked(
    model: CausalLM,
    items: list[ScoreItem],
    adapters: Mapping[int, LoraAdapter],
    max_step_tokens: int,
    top_n: int,
) -> list[list[ScoredToken]]:
    """As ``score_tokens``, each scored token with its row's ``top_n`` alternatives (``top_n`` >= 0;
    above the vocabulary: all of it). The log-probs have the bits ``score_tokens`` returns."""
    if top_n < 0:
        raise ValueError(f"top_n: must be >= 0, got {top_n}")
    out: list[list[ScoredToken]] = [[] for _ in items]
    for group in _steps(items, max_step_tokens):
        for index, scored in zip(
            group, _score_step(model, [items[i] for i in group], adapters, top_n), strict=True
        ):
            out[index] = scored
    return out


def _steps(items: list[ScoreItem], budget: int) -> list[list[int]]:
    """Item indices grouped in order, each group's tokens within ``budget`` (or one item alone)."""
    groups: list[list[int]] = []
    used = budget
    for index, item in enumerate(items):
        size = len(item.prompt_ids) + len(item.token_ids)
        if used + size > budget:
            groups.append([])
            used = 0
        groups[-1].append(index)
        used += size
    return groups


def _score_step(
    model: CausalLM, items: list[ScoreItem], adapters: Mapping[int, LoraAdapter], top_n: int
) -> list[list[ScoredToken]]:
    weight = model.lm_head.weight
    sequences = [list(item.prompt_ids + item.token_ids) for item in items]
    model.check_ids(torch.tensor([t for s in sequences for t in s], device=weight.device))
    cache = ContiguousCache(
        len(items), model.config, weight.dtype, weight.device, model.numerics.batch_invariant
    )
    steps = [
        dataclasses.replace(step, adapter=item.adapter)
        for step, item in zip(cache.steps(sequences), items, strict=True)
    ]
    rows, start = [], 0
    for item, sequence in zip(items, sequences, strict=True):
        first = start + len(item.prompt_ids) - 1  # the last prompt row scores the first continuation token
        rows.extend(range(first, first + len(item.token_ids)))
        start += len(sequence)
    if not rows:
        return [[] for _ in items]
    meta = build_step_metadata(
        steps, cache.block_size, weight.device, logit_rows=rows, index_topk=model.index_topk
    )
    used = {item.adapter for item in items if item.adapter}
    logits = model.forward_step(meta, cache, {slot: adapters[slot] for slot in used} or None)
    out, row = [], 0
    for item in items:
        out.append([_scored(logits[row + k], token, top_n) for k, token in enumerate(item.token_ids)])
        row += len(item.token_ids)
    return out


def _scored(logits_row: torch.Tensor, token: int, top_n: int) -> ScoredToken:
    """One row's token and alternatives, both from one ``raw_logprobs`` row (the sampler's float32
    log-softmax of that row alone: a batched one could round differently with the batch)."""
    raw = raw_logprobs(logits_row)
    top = tuple(top_n_logprobs(raw, top_n)) if top_n else ()
    return ScoredToken(raw[token].item(), top)
