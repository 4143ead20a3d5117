"""Token sampling: greedy, temperature, top-k, top-p, min-p, with batch-independent randomness.

Reproducibility contract: the token (and logprobs) of row i depend only on ``logits[i]``,
``params[i]`` and ``positions[i]``; never on the other rows, the batch size or i. Two things make
this hold:

* every row is processed on its own, so each tensor op sees the same shapes whatever the batch
  (batched reductions such as softmax may round differently with the batch size);
* the randomness of a seeded request comes from a fresh generator seeded with
  ``splitmix64(splitmix64(seed) ^ position)``, so a request that is preempted and recomputed, or
  whose prefix came from a cache, draws the same numbers at the same position.

Sampling uses the exponential race: with q_j ~ Exp(1) independent, ``argmax_j p_j / q_j`` is
distributed as p, and q_j depends only on (seed, position, j), not on which tokens were filtered.
Unseeded requests get a generator seeded from the OS at every call.

The random draws come from a generator on the logits' device, so the same seed gives the same
tokens on the same kind of device (CPU and CUDA generators differ).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from common.sampling_params import SamplingParams

_MASK64 = (1 << 64) - 1
# SystemRandom reads the OS entropy source; it has no state of its own to share or reseed.
_SYSTEM_RANDOM = random.SystemRandom()


@dataclass(frozen=True)
class SampleOutput:
    """Result of `sample` for a batch of N rows (lists of length N, in row order).

    Attributes:
        token_ids: the sampled token of each row.
        logprobs: logprob of the sampled token under the raw model distribution (log_softmax of
            the unmodified logits in float32), as a Python float holding a float32 value exactly;
            None where the row's ``params.logprobs`` is None.
        top_logprobs: the ``params.logprobs`` most likely (token id, raw logprob) pairs, sorted by
            logprob descending then token id ascending; None where ``params.logprobs`` is None or 0.
    """

    token_ids: list[int]
    logprobs: list[float | None]
    top_logprobs: list[list[tuple[int, float]] | None]


def splitmix64(x: int) -> int:
    """One step of the splitmix64 mixer: a bijection of 64-bit integers with good avalanche."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def generator_seed(seed: int, position: int) -> int:
    """The 64-bit generator seed for drawing the token at `position` of a request seeded `seed`."""
    return splitmix64(splitmix64(seed) ^ position)


def sample(logits: torch.Tensor, params: list[SamplingParams], positions: list[int]) -> SampleOutput:
    """Pick one token per row.

    Args:
        logits: ``[N, V]`` next-token logits, any float dtype; computed on in float32.
        params: N sampling parameters, one per row.
        positions: N indices, ``positions[i]`` = number of tokens row i's request has generated so
            far (the index of the token being drawn). Seeded draws depend on it.

    Returns:
        SampleOutput. Greedy rows take the argmax (ties: lowest id). Other rows apply, in order,
        temperature, top-k, top-p, min-p, then sample from what is left.
    """
    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"logits: expected a [N, V] float tensor, got {tuple(logits.shape)} {logits.dtype}")
    n = logits.shape[0]
    if len(params) != n or len(positions) != n:
        raise ValueError(f"params, positions: expected {n} each, got {len(params)} and {len(positions)}")
    bad = next((i for i, p in enumerate(positions) if p < 0), None)
    if bad is not None:
        raise ValueError(f"positions: must be >= 0, got {positions[bad]} at row {bad}")

    token_ids: list[int] = []
    logprobs: list[float | None] = []
    top_logprobs: list[list[tuple[int, float]] | None] = []
    for i in range(n):
        row = logits[i].to(torch.float32).contiguous()
        token = _sample_row(row, params[i], positions[i])
        token_ids.append(token)
        if params[i].logprobs is None:
            logprobs.append(None)
            top_logprobs.append(None)
            continue
        raw = raw_logprobs(row)
        logprobs.append(raw[token].item())
        top_logprobs.append(top_n_logprobs(raw, params[i].logprobs) if params[i].logprobs > 0 else None)
    return SampleOutput(token_ids=token_ids, logprobs=logprobs, top_logprobs=top_logprobs)


def raw_logprobs(row: torch.Tensor) -> torch.Tensor:
    """The raw log-probs of one ``[V]`` logits row: ``log_softmax`` over the row alone, in float32,
    contiguous (a batched one could round differently with the batch). Every logprob the engine
    reports comes from here: the sampled tokens', ``LLM.score``'s, and the trainer's recomputation."""
    return torch.log_softmax(row.to(torch.float32).contiguous(), dim=-1)


def filtered_probs(row: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The probabilities a non-greedy request samples one float32 ``[V]`` logits row from.

    Applies, in order, temperature, top-k, top-p and min-p. Returns ``[V]`` float32: the softmax of
    the tempered, top-k-masked row, set to 0 where top-p or min-p drop the token. It is not
    renormalised after top-p and min-p (it sums to at most 1): the sampler's race does not need it,
    and dividing would round; divide by the sum for the distribution itself.
    """
    x = row / params.temperature
    vocab = x.shape[0]
    if 0 < params.top_k < vocab:
        kth = torch.topk(x, params.top_k, sorted=False).values.min()
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    keep = probs > 0
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True, stable=True)
        # Mass of the strictly more likely tokens; a token stays while that mass is below top_p,
        # which keeps the smallest prefix reaching top_p and always the most likely token.
        before = torch.zeros_like(sorted_probs)
        torch.cumsum(sorted_probs[:-1], dim=0, out=before[1:])
        keep[order[before >= params.top_p]] = False
    if params.min_p > 0.0:
        keep &= probs >= params.min_p * probs.max()
    return torch.where(keep, probs, 0.0)


def _sample_row(row: torch.Tensor, params: SamplingParams, position: int) -> int:
    """One token from one float32 ``[V]`` row."""
    if params.greedy:
        return int(torch.argmax(row))  # argmax returns the first maximal index

    probs = filtered_probs(row, params)
    if params.seed is None:
        seed = _SYSTEM_RANDOM.getrandbits(64)
    else:
        seed = generator_seed(params.seed, position)
    generator = torch.Generator(device=row.device)
    generator.manual_seed(seed)
    q = torch.empty(probs.shape[0], dtype=torch.float32, device=row.device).exponential_(generator=generator)
    # A draw of exactly 0 (if the generator ever yields one) makes that token win, as it would in
    # the limit q -> 0; filtered tokens have p = 0 and are masked, so 0 / 0 never reaches the argmax.
    race = torch.where(probs > 0, probs / q, -1.0)
    return int(torch.argmax(race))


def top_n_logprobs(raw: torch.Tensor, n: int) -> list[tuple[int, float]]:
    """The n largest entries of `raw` as (id, value), value descending then id ascending."""
    n = min(n, raw.shape[0])
    values, ids = torch.topk(raw, n, sorted=False)
    threshold = values.min()
    if int((raw >= threshold).sum()) > n:
        # Ties at the threshold: topk picked some of them arbitrarily, so take every tied id and
        # let the (value, id) sort below keep the lowest ones.
        ids = torch.nonzero(raw >= threshold).squeeze(1)
        values = raw[ids]
    pairs = sorted(zip(ids.tolist(), values.tolist(), strict=True), key=lambda pair: (-pair[1], pair[0]))
    return pairs[:n]
