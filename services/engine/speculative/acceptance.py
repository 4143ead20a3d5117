"""Which drafted tokens the target accepts, and the token it adds: a verify step's requests.

Greedy requests (temperature 0) take the sampler's own tokens for every verified row and accept
drafts while they equal them, so the tokens and log-probs are the ones plain decoding would give
for the same logits rows; a step's greedy requests are sampled in one call (``verify_greedy``: one
launch and one device-to-host copy for the batch, not one per request). Other requests go through
rejection sampling (``rejection.py``), one at a time.
"""

from dataclasses import dataclass

import torch

from common.sampling_params import SamplingParams
from services.engine.model.backends.sampling import SamplingBackend

from .proposal import DraftTokens


@dataclass(frozen=True)
class Verified:
    """The outcome of verifying one request's drafts.

    Attributes:
        token_ids: the accepted drafts, then the target's own token: ``num_accepted + 1`` tokens.
        logprobs: each token's raw log-prob under the target (``sampler.raw_logprobs`` of its row);
            None when the request asked for none.
        top_logprobs: per token, as the sampler reports them; None when not asked for.
        num_accepted: how many drafts were accepted (0 to ``k``).
    """

    token_ids: list[int]
    logprobs: list[float] | None
    top_logprobs: list[list[tuple[int, float]]] | None
    num_accepted: int


def verify(
    logits: torch.Tensor,
    drafts: DraftTokens,
    params: SamplingParams,
    position: int,
    sampling: SamplingBackend,
) -> Verified:
    """Accept a prefix of ``drafts`` and add the target's next token.

    Args:
        logits: ``[1 + k, vocab]``: row ``i`` is the target's next-token logits after the request's
            known tokens and the first ``i`` drafts.
        drafts: the ``k`` drafted tokens (and their distributions when sampled).
        params: the request's sampling parameters.
        position: the request's sample position at row 0 (tokens generated so far); row ``i`` draws
            the token at ``position + i``.
        sampling: the engine's sampling backend (greedy rows and log-probs come from it).

    Raises:
        ValueError: ``logits`` rows do not match the drafts, or a sampled request's drafts carry no
            distributions.
    """
    k = len(drafts.token_ids)
    if logits.dim() != 2 or logits.shape[0] != k + 1:
        raise ValueError(f"logits: expected [{k + 1}, vocab] for {k} drafts, got {tuple(logits.shape)}")
    if not params.greedy:
        from .rejection import verify_sampled

        return verify_sampled(logits, drafts, params, position, sampling)
    return verify_greedy([logits], [drafts], [params], [position], sampling)[0]


def verify_greedy(
    logits: list[torch.Tensor],
    drafts: list[DraftTokens],
    params: list[SamplingParams],
    positions: list[int],
    sampling: SamplingBackend,
) -> list[Verified]:
    """``verify`` for greedy requests, all of their rows sampled in one call (each row's result does
    not depend on the others, so the outcome is each request's own).

    Args:
        logits: per request ``[1 + k, vocab]`` (``k`` its number of drafts).
        drafts, params, positions: per request, as in ``verify`` (every ``params`` greedy).
    """
    counts = [rows.shape[0] for rows in logits]
    rows = sampling.sample(
        torch.cat(logits),
        [p for p, count in zip(params, counts, strict=True) for _ in range(count)],
        [position + i for position, count in zip(positions, counts, strict=True) for i in range(count)],
    )
    results, start = [], 0
    for request_drafts, request_params, count in zip(drafts, params, counts, strict=True):
        k = len(request_drafts.token_ids)
        tokens = rows.token_ids[start : start + k + 1]
        accepted = 0
        while accepted < k and request_drafts.token_ids[accepted] == tokens[accepted]:
            accepted += 1
        kept = accepted + 1
        results.append(
            Verified(
                token_ids=tokens[:kept],
                logprobs=None if request_params.logprobs is None else rows.logprobs[start : start + kept],
                top_logprobs=None if not request_params.logprobs else rows.top_logprobs[start : start + kept],
                num_accepted=accepted,
            )
        )
        start += count
    return results
