"""Rejection sampling of drafted tokens (``speculative/rejection.py``): the emitted tokens follow the
target's distribution whatever the draft's, seeded requests repeat, log-probs are the raw ones.

The target is a tiny Markov chain over ``V = 6`` tokens: row 0 is fixed, the row after token ``t`` is
``NEXT[t]``, so the logits rows of a verify step are ``[FIRST, NEXT[d_0], NEXT[d_1]]``. Drafts are drawn
from their stated distributions by a generator of their own.
"""

import pytest
import torch

from common.sampling_params import SamplingParams
from services.engine.model.backends.sampling import ReferenceSampling
from services.engine.sampling.sampler import filtered_probs, raw_logprobs, sample
from services.engine.speculative import acceptance, rejection
from services.engine.speculative.proposal import DraftTokens
from services.engine.speculative.rejection import verify_sampled

V = 6
K = 2
POSITION = 7
TRIALS = 2400
# Token 5 is impossible for the target after nothing and after token 0.
FIRST = torch.tensor([1.2, 0.3, -0.4, 0.9, -1.5, float("-inf")])
NEXT = torch.tensor(
    [
        [0.1, 1.0, -0.7, 0.4, -0.2, float("-inf")],
        [-1.0, 0.2, 1.3, 0.0, 0.5, -0.3],
        [0.8, -0.6, 0.1, 1.1, -1.2, 0.4],
        [0.0, 0.0, 0.9, -0.9, 0.3, 0.6],
        [1.5, -0.1, -0.3, 0.2, 0.7, -1.0],
        [-0.5, 0.6, 0.0, -0.4, 1.0, 0.2],
    ]
)
# Most of the draft's mass on the tokens the target finds unlikely or impossible.
SKEWED_DRAFT = torch.tensor([0.02, 0.08, 0.2, 0.05, 0.25, 0.4])
UNIFORM_DRAFT = torch.full((V,), 1.0 / V)
PLAIN = SamplingParams(temperature=0.8, seed=0)
FILTERED = SamplingParams(temperature=1.3, top_k=4, top_p=0.9, seed=0)


def target(row: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution the sampler draws ``row`` from under ``params`` (normalised)."""
    probs = filtered_probs(row, params)
    return probs / probs.sum()


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's goodness of fit of ``counts`` to ``probs``; cells the target forbids must be empty."""
    assert int(counts[probs == 0].sum()) == 0, f"tokens drawn where the target has no mass: {counts}"
    live = probs > 0
    expected = probs[live] * counts.sum()
    statistic = float(((counts[live] - expected) ** 2 / expected).sum())
    degrees = int(live.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(degrees / 2.0), torch.tensor(statistic / 2.0)))


def run_trials(params: SamplingParams, draft: torch.Tensor, trials: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``trials`` verify steps, seeds ``0..trials-1``, drafting from ``draft`` at every position: the
    first token's counts ``[V]`` and, where the first draft was accepted, the second token's counts by
    first token ``[V, V]``."""
    first = torch.zeros(V)
    second = torch.zeros(V, V)
    drafted = torch.multinomial(
        draft, trials * K, replacement=True, generator=torch.Generator().manual_seed(1234)
    )
    probs = draft.expand(K, V).clone()
    for seed, tokens in enumerate(drafted.view(trials, K).tolist()):
        request = SamplingParams(
            temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=seed
        )
        logits = torch.stack([FIRST] + [NEXT[t] for t in tokens])
        verified = verify_sampled(
            logits, DraftTokens(tuple(tokens), probs), request, POSITION, ReferenceSampling()
        )
        first[verified.token_ids[0]] += 1
        if verified.num_accepted >= 1:
            second[verified.token_ids[0], verified.token_ids[1]] += 1
    return first, second


@pytest.mark.parametrize(
    "params, draft, trials",
    [(PLAIN, SKEWED_DRAFT, TRIALS), (FILTERED, UNIFORM_DRAFT, TRIALS // 2)],
    ids=["skewed-draft", "top-k-top-p-target"],
)
def test_tokens_follow_the_target(params, draft, trials):
    first, second = run_trials(params, draft, trials)
    assert chi_square_p_value(first, target(FIRST, params)) > 1e-3
    for token in range(V):
        if second[token].sum() >= 50:
            assert chi_square_p_value(second[token], target(NEXT[token], params)) > 1e-3, f"after {token}"
    assert second.sum() > trials / 10  # the second token was really tested


def test_forgetting_the_residual_is_caught(monkeypatch):
    """The same trials with rejected positions drawing from the target row instead of the residual:
    the test above must tell the difference."""
    monkeypatch.setattr(rejection, "residual", lambda p, q: p)
    first, _ = run_trials(PLAIN, SKEWED_DRAFT, TRIALS // 4)
    assert chi_square_p_value(first, target(FIRST, PLAIN)) < 1e-6


def test_draft_equal_to_target_is_always_accepted_and_the_bonus_is_the_sampler_token():
    drafting = torch.Generator().manual_seed(5)
    for seed in range(200):
        params = SamplingParams(temperature=0.8, seed=seed, logprobs=0)
        rows, probs, tokens = [FIRST], [], []
        for _ in range(K):
            q = target(rows[-1], params)
            tokens.append(int(torch.multinomial(q, 1, generator=drafting)))
            probs.append(q)
            rows.append(NEXT[tokens[-1]])
        logits = torch.stack(rows)
        verified = verify_sampled(
            logits, DraftTokens(tuple(tokens), torch.stack(probs)), params, 3, ReferenceSampling()
        )
        plain = sample(logits[K:], [params], [3 + K])
        assert verified.num_accepted == K
        assert verified.token_ids == tokens + plain.token_ids
        assert verified.logprobs[K] == plain.logprobs[0]


def drafts_for(seed: int) -> tuple[torch.Tensor, DraftTokens]:
    generator = torch.Generator().manual_seed(seed)
    tokens = tuple(int(t) for t in torch.multinomial(SKEWED_DRAFT, K, replacement=True, generator=generator))
    logits = torch.stack([FIRST] + [NEXT[t] for t in tokens])
    return logits, DraftTokens(tokens, SKEWED_DRAFT.expand(K, V).clone())


def test_same_seed_same_tokens():
    outcomes = set()
    for seed in range(40):
        logits, drafts = drafts_for(seed)
        params = SamplingParams(temperature=0.8, seed=seed)
        runs = [verify_sampled(logits, drafts, params, POSITION, ReferenceSampling()) for _ in range(2)]
        assert runs[0] == runs[1]
        outcomes.add(tuple(runs[0].token_ids))
    assert len(outcomes) > 5  # the seed matters


def test_position_changes_the_draws():
    logits, drafts = drafts_for(3)
    params = SamplingParams(temperature=0.8, seed=11)
    outcomes = {
        tuple(verify_sampled(logits, drafts, params, p, ReferenceSampling()).token_ids) for p in range(30)
    }
    assert len(outcomes) > 1


def test_logprobs_are_the_raw_ones_of_each_row():
    for seed in range(20):
        logits, drafts = drafts_for(seed)
        params = SamplingParams(temperature=0.8, top_k=3, seed=seed, logprobs=3)
        verified = verify_sampled(logits, drafts, params, POSITION, ReferenceSampling())
        for row, token in enumerate(verified.token_ids):
            assert verified.logprobs[row] == raw_logprobs(logits[row])[token].item()
            reported = sample(logits[row : row + 1], [params], [0]).top_logprobs[0]
            assert verified.top_logprobs[row] == reported


def test_acceptance_sends_sampled_requests_here():
    logits, drafts = drafts_for(9)
    params = SamplingParams(temperature=0.8, seed=9, logprobs=0)
    assert acceptance.verify(logits, drafts, params, 4, ReferenceSampling()) == verify_sampled(
        logits, drafts, params, 4, ReferenceSampling()
    )


@pytest.mark.parametrize(
    "drafts, field",
    [
        (DraftTokens((1, 2)), "drafts.probs"),
        (DraftTokens((1, 2), torch.full((2, V + 1), 1.0 / (V + 1))), "drafts.probs"),
        (DraftTokens((1, V), UNIFORM_DRAFT.expand(2, V)), "drafts.token_ids"),
        (DraftTokens((1, 5), torch.stack([UNIFORM_DRAFT, FIRST.softmax(0)])), "drafts.probs"),
    ],
    ids=["no-probs", "vocab-mismatch", "token-out-of-vocab", "draft-with-zero-probability"],
)
def test_bad_drafts_name_the_field(drafts, field):
    logits = torch.stack([FIRST, NEXT[1], NEXT[2]])
    with pytest.raises(ValueError, match=field):
        verify_sampled(logits, drafts, PLAIN, 0, ReferenceSampling())
