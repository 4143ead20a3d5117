"""Exact acceptance of sampled drafts (temperature > 0): rejection sampling.

For draft position ``i`` with target distribution ``p_i`` (the target's row ``i`` after the request's
temperature, top-k, top-p and min-p: ``sampler.filtered_probs``, normalised) and draft distribution
``q_i`` (``DraftTokens.probs[i]``), the drafted token ``d_i`` is accepted when ``u_i * q_i(d_i) <=
p_i(d_i)`` with ``u_i ~ U[0, 1)``. The first rejected position draws its token from the residual
``max(0, p_i - q_i)`` normalised, and the step ends there; when all ``k`` drafts are accepted the target
adds the token at ``position + k`` exactly as plain decoding draws it from row ``k``. Every emitted
token is then distributed as the target alone would give it, whatever ``q``.

Randomness: a seeded request's ``u_i`` and residual draw come from generators seeded with
``splitmix64(generator_seed(seed, position + i) ^ STREAM)``, one constant per use, so they are
independent of each other and of the plain sampler's stream at the same position (which a draft model
sampling with the request's seed uses for ``d_i``, and the bonus token uses). A request's tokens then
depend only on its seed, its position, its drafts and the logits rows. Unseeded requests draw their
generator seeds from the OS.
"""

import random

import torch

from common.sampling_params import SamplingParams
from services.engine.model.backends.sampling import SamplingBackend
from services.engine.sampling.sampler import (
    filtered_probs,
    generator_seed,
    raw_logprobs,
    splitmix64,
    top_n_logprobs,
)

from .acceptance import Verified
from .proposal import DraftTokens

# Stream constants mixed into the per-position generator seed (arbitrary odd 64-bit values): one for
# the acceptance test's uniform, one for the residual's exponential race.
ACCEPT_STREAM = 0xA5E3_7C1D_29B4_F00D
RESIDUAL_STREAM = 0x5C0F_FEE1_D3AD_B33F
# SystemRandom reads the OS entropy source; it has no state of its own to share or reseed.
_SYSTEM_RANDOM = random.SystemRandom()


def verify_sampled(
    logits: torch.Tensor,
    drafts: DraftTokens,
    params: SamplingParams,
    position: int,
    sampling: SamplingBackend,
) -> Verified:
    """Accept a prefix of a sampled request's ``drafts`` by rejection sampling and add one token.

    Arguments as ``acceptance.verify`` (here ``params.temperature > 0`` and ``drafts.probs [k, vocab]``,
    the distributions the drafts were drawn from, given); ``sampling`` draws the extra token when every
    draft is accepted.

    Returns:
        ``Verified``: the accepted drafts then one more token; log-probs are the raw ones of each
        token's own row (``raw_logprobs``), as the sampler reports them.

    Raises:
        ValueError: shapes do not match, ``drafts.probs`` is missing, or a draft reached has
            probability 0 under its own distribution.
    """
    _check(logits, drafts, params)
    k = len(drafts.token_ids)
    rows = logits.to(torch.float32)
    draft_probs = drafts.probs.to(device=rows.device, dtype=torch.float32)
    tokens: list[int] = []
    for i, draft in enumerate(drafts.token_ids):
        filtered = filtered_probs(rows[i].contiguous(), params)
        p = filtered / filtered.sum()
        q = draft_probs[i]
        drafted = q[draft].item()
        if drafted <= 0:
            raise ValueError(
                f"drafts.probs: row {i} gives its drafted token {draft} probability 0; a draft must come "
                "from its own distribution"
            )
        accept = _generator(params, position + i, ACCEPT_STREAM, rows.device)
        u = torch.rand((), dtype=torch.float64, device=rows.device, generator=accept).item()
        if u * drafted <= p[draft].item():
            tokens.append(draft)
            continue
        race = _generator(params, position + i, RESIDUAL_STREAM, rows.device)
        tokens.append(_race(residual(p, q), race))
        return _verified(rows, tokens, params, num_accepted=i)
    bonus = sampling.sample(logits[k : k + 1], [params], [position + k])
    tokens.append(bonus.token_ids[0])
    return _verified(rows, tokens, params, num_accepted=k)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Where a rejected position draws from: ``max(0, p - q)`` (unnormalised, ``[V]``). When ``p`` and
    ``q`` differ by rounding alone it can be all zero; then it is ``p`` (the limit as ``q -> p``)."""
    excess = (p - q).clamp_min(0.0)
    return excess if bool((excess > 0).any()) else p


def _race(weights: torch.Tensor, generator: torch.Generator) -> int:
    """A token drawn with probability proportional to ``weights [V]`` (>= 0, some > 0): the exponential
    race, as the sampler draws (``argmax_j w_j / e_j`` with ``e_j ~ Exp(1)``)."""
    e = torch.empty_like(weights).exponential_(generator=generator)
    return int(torch.argmax(torch.where(weights > 0, weights / e, -1.0)))


def _generator(params: SamplingParams, position: int, stream: int, device: torch.device) -> torch.Generator:
    """The generator of one use (``stream``) at ``position``: seeded from the request's seed, or the OS."""
    if params.seed is None:
        seed = _SYSTEM_RANDOM.getrandbits(64)
    else:
        seed = splitmix64(generator_seed(params.seed, position) ^ stream)
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def _verified(rows: torch.Tensor, tokens: list[int], params: SamplingParams, num_accepted: int) -> Verified:
    """``Verified`` with the raw log-probs of each token from its own row when the request asked."""
    if params.logprobs is None:
        return Verified(token_ids=tokens, logprobs=None, top_logprobs=None, num_accepted=num_accepted)
    raws = [raw_logprobs(rows[i]) for i in range(len(tokens))]
    return Verified(
        token_ids=tokens,
        logprobs=[raw[token].item() for raw, token in zip(raws, tokens, strict=True)],
        top_logprobs=[top_n_logprobs(raw, params.logprobs) for raw in raws] if params.logprobs else None,
        num_accepted=num_accepted,
    )


def _check(logits: torch.Tensor, drafts: DraftTokens, params: SamplingParams) -> None:
    k = len(drafts.token_ids)
    if logits.dim() != 2 or logits.shape[0] != k + 1 or not logits.is_floating_point():
        raise ValueError(
            f"logits: expected a float [{k + 1}, vocab] for {k} drafts, got {tuple(logits.shape)}"
        )
    if params.greedy:
        raise ValueError("params.temperature: rejection sampling is for temperature > 0; greedy uses verify")
    vocab = logits.shape[1]
    if drafts.probs is None:
        raise ValueError(
            f"drafts.probs: a sampled request (temperature {params.temperature}) needs the drafts' "
            f"distributions [{k}, {vocab}], got None"
        )
    if tuple(drafts.probs.shape) != (k, vocab):
        raise ValueError(
            f"drafts.probs: expected [{k}, {vocab}] (drafts, logits' vocab), got {tuple(drafts.probs.shape)}"
        )
    bad = next((t for t in drafts.token_ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise ValueError(f"drafts.token_ids: {bad} is outside the vocab [0, {vocab})")
