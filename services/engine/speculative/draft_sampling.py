"""How a draft model picks each drafted token from its logits row, and the distribution it records.

Greedy requests take the argmax (ties: the lowest id), as the sampler does. Other requests draw from
the request's *filtered* distribution: the sampler's ``filtered_probs`` (temperature, top-k, top-p and
min-p, exactly as it samples), renormalised. That row is what ``DraftTokens.probs`` records and what
rejection sampling divides by.

Randomness: a seeded request's draw at sample position ``p`` uses a fresh generator seeded with
``splitmix64(generator_seed(seed, p) ^ DRAFT_STREAM)``. The target's own draw at ``p`` uses
``generator_seed(seed, p)``; mixing in ``DRAFT_STREAM`` keeps the draft's numbers independent of the
target's (rejection sampling assumes the draft's draw and the target's acceptance test are
independent), while the same seed still gives the same drafts. Unseeded requests draw from the OS.
"""

import random

import torch

from common.sampling_params import SamplingParams
from services.engine.sampling.sampler import filtered_probs, generator_seed, splitmix64

# "draft" in ASCII: the draft's random stream, XORed into the target's per-position generator seed.
DRAFT_STREAM = 0x6472616674
_SYSTEM_RANDOM = random.SystemRandom()


def draft_distribution(row: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a non-greedy request's draft is drawn from, for one logits row: the sampler's
    ``filtered_probs`` (temperature, top-k, top-p, min-p) renormalised to sum to 1.

    Args:
        row: ``[V]`` logits, any float dtype (computed on in float32).
        params: a non-greedy request's parameters.
    """
    kept = filtered_probs(row.to(torch.float32).contiguous(), params)
    return kept / kept.sum()


def draft_generator_seed(seed: int, position: int) -> int:
    """The 64-bit generator seed of the draft's draw at sample ``position`` of a request seeded ``seed``."""
    return splitmix64(generator_seed(seed, position) ^ DRAFT_STREAM)


def draw_drafts(
    logits: torch.Tensor, params: list[SamplingParams], positions: list[int]
) -> tuple[list[int], list[torch.Tensor | None]]:
    """One drafted token per logits row.

    Args:
        logits: ``[R, V]`` draft logits, one row per request.
        params: each row's request's sampling parameters.
        positions: each row's sample position (tokens its request generated before the drafted one).

    Returns:
        ``(tokens, probs)``: a greedy row's token is its argmax (ties: the lowest id; one batched argmax,
        exact whatever the batch) and its probs None; any other row's token is drawn from
        ``draft_distribution(row, params)`` (the exponential race, as the sampler draws) and its probs that
        ``[V]`` float32 row.
    """
    tokens = torch.argmax(logits.to(torch.float32), dim=-1).tolist()
    probs: list[torch.Tensor | None] = [None] * len(tokens)
    for i, (row_params, position) in enumerate(zip(params, positions, strict=True)):
        if not row_params.greedy:
            tokens[i], probs[i] = _draw(logits[i], row_params, position)
    return tokens, probs


def _draw(row: torch.Tensor, params: SamplingParams, position: int) -> tuple[int, torch.Tensor]:
    probs = draft_distribution(row, params)
    seed = (
        _SYSTEM_RANDOM.getrandbits(64) if params.seed is None else draft_generator_seed(params.seed, position)
    )
    generator = torch.Generator(device=row.device)
    generator.manual_seed(seed)
    q = torch.empty(probs.shape[0], dtype=torch.float32, device=row.device).exponential_(generator=generator)
    # argmax_j p_j / q_j with q_j ~ Exp(1) is distributed as p; removed tokens (p = 0) never win.
    race = torch.where(probs > 0, probs / q, -1.0)
    return int(torch.argmax(race)), probs
