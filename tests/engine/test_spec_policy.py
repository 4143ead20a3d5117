"""``SpecPolicy`` on synthetic step times and acceptance (no clock, no model): the warm-up drafts ``K``,
the rule picks 0 where verify + draft cost more than the tokens they add and the best ``k`` otherwise,
the margin, exploration of the stalest option, buckets by powers of two, and acceptance by position."""

import pytest

from services.engine.speculative.spec_policy import PLAIN, SpecPolicy, bucket_of

K = 4
BATCH = 8


def warmed(alpha: float, k: int = K, **options) -> SpecPolicy:
    """A policy past its warm-up whose every position's acceptance is ``alpha`` (verifies of ``k``
    drafts whose accepted counts follow that rate, position by position)."""
    policy = SpecPolicy(k, **options)
    policy.alpha = [alpha] * k
    policy.verify_steps = policy.warmup_verify_steps
    return policy


def time_steps(policy: SpecPolicy, plain: float, target, draft, batch: int = BATCH) -> None:
    """Measure the plain step and every ``k`` in ``batch``'s bucket: ``target(k)`` and ``draft(k)``."""
    policy.observe_step(batch, PLAIN, plain, 0.0)
    for k in range(1, policy.num_draft_tokens + 1):
        policy.observe_step(batch, k, target(k), draft(k))


def decide(policy: SpecPolicy, steps: int, batch: int = BATCH) -> list[int]:
    return [policy.choose(batch) for _ in range(steps)]


def test_warm_up_drafts_k_even_where_plain_steps_are_faster():
    policy = SpecPolicy(K)
    time_steps(policy, plain=1.0, target=lambda k: 10.0, draft=lambda k: 10.0)
    for _ in range(15):
        assert policy.choose(BATCH) == K
        policy.observe_verifies([(K, 0)] * BATCH)
    assert policy.choose(BATCH) == K  # the 16th verify step is still the warm-up's
    policy.observe_verifies([(K, 0)] * BATCH)
    assert policy.choose(BATCH) != K  # the rule decides from here
    assert policy.best(BATCH) == PLAIN


def test_zero_when_verify_and_draft_cost_more_than_the_tokens_they_add():
    """alpha 0.5: at most E_4 = 1.9375 tokens per verify, for twice a plain step's time."""
    policy = warmed(0.5)
    time_steps(policy, plain=1.0, target=lambda k: 1.0, draft=lambda k: 1.0)
    assert policy.expected_tokens(K) == pytest.approx(1.9375)
    assert policy.best(BATCH) == PLAIN
    assert decide(policy, 15) == [PLAIN] * 15  # the 16th explores (below)


def test_the_best_k_on_synthetic_costs():
    """alpha 0.8, target 1 + 0.05 k, draft 0.2 k: tokens per second 1.44, 1.63, 1.69, 1.68 at k = 1..4."""
    policy = warmed(0.8)
    time_steps(policy, plain=1.0, target=lambda k: 1.0 + 0.05 * k, draft=lambda k: 0.2 * k)
    rates = [policy.expected_tokens(k) / (1.0 + 0.25 * k) for k in range(1, K + 1)]
    assert rates == pytest.approx([1.44, 1.6267, 1.6869, 1.6808], abs=1e-4)
    assert policy.best(BATCH) == 3
    assert decide(policy, 15) == [3] * 15


@pytest.mark.parametrize(("draft", "best"), [(0.95, PLAIN), (0.85, 1)], ids=["2.6%-win", "8.1%-win"])
def test_a_win_below_the_margin_is_a_plain_step(draft, best):
    """E_1 = 2 tokens for 1.95 or 1.85 plain steps' time: a 2.6% win stays off (margin 5%), 8.1% drafts."""
    policy = warmed(1.0, k=1)
    time_steps(policy, plain=1.0, target=lambda k: 1.0, draft=lambda k: draft)
    assert policy.best(BATCH) == best


def test_exploration_tries_the_untried_then_the_stalest_every_n_decisions():
    """Off (plain wins): the bucket first tries the options the warm-up did not (0..K-1, one step each),
    then every 16th decision the option used longest ago, which then moves to the back of the queue."""
    policy = warmed(0.0)
    policy.observe_step(BATCH, K, 1.0, 1.0)  # the warm-up timed K only
    chosen = []
    for _ in range(48):
        k = policy.choose(BATCH)
        chosen.append(k)
        policy.observe_step(BATCH, k, 1.0, 1.0 if k else 0.0)
    explored = {decision: k for decision, k in enumerate(chosen, 1) if k != PLAIN}
    assert chosen[0] == PLAIN and explored == {2: 1, 3: 2, 4: 3, 16: K, 32: 1, 48: 2}


def test_while_speculating_a_plain_step_is_timed_every_n_decisions():
    policy = warmed(1.0)
    time_steps(policy, plain=1.0, target=lambda k: 1.0, draft=lambda k: 0.1 * k)
    chosen = []
    for _ in range(48):
        k = policy.choose(BATCH)
        chosen.append(k)
        policy.observe_step(BATCH, k, 1.0, 0.1 * k)
    assert policy.best(BATCH) == K
    assert [(decision, k) for decision, k in enumerate(chosen, 1) if k != K] == [
        (16, PLAIN),
        (32, 1),
        (48, 2),
    ]


def test_buckets_are_powers_of_two_and_an_untimed_bucket_tries_each_k_then_drafts_k():
    assert [bucket_of(n) for n in (1, 2, 3, 4, 7, 8, 33)] == [1, 2, 2, 4, 4, 8, 32]
    policy = warmed(0.5)
    time_steps(policy, plain=1.0, target=lambda k: 1.0, draft=lambda k: 1.0, batch=5)
    assert policy.best(7) == PLAIN and policy.best(8) is None
    assert decide(policy, K + 3, batch=8) == [PLAIN, 1, 2, 3, K, K, K]  # none timed: fixed
    with pytest.raises(ValueError, match="batch_size"):
        bucket_of(0)


def test_acceptance_by_position_counts_only_verifies_that_reached_it():
    policy = SpecPolicy(3, smoothing=0.5)
    policy.observe_verifies([(3, 3), (3, 1), (2, 0), (1, 1)])
    assert policy.alpha == [0.75, 0.5, 1.0]
    assert policy.expected_tokens(3) == pytest.approx(1 + 0.75 + 0.375 + 0.375)
    policy.observe_verifies([(3, 0)])  # reaches position 0 only
    assert policy.alpha == [0.375, 0.5, 1.0] and policy.verify_steps == 2
    policy.observe_verifies([])  # a step without verifies
    assert policy.verify_steps == 2


def test_an_unreached_position_takes_the_one_before_it():
    policy = SpecPolicy(3)
    policy.observe_verifies([(1, 1), (1, 0)])
    assert policy.alpha == [0.5, None, None]
    assert policy.expected_tokens(3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)


def test_bad_arguments_name_what_to_fix():
    with pytest.raises(ValueError, match="num_draft_tokens"):
        SpecPolicy(0)
    with pytest.raises(ValueError, match="explore_every"):
        SpecPolicy(2, explore_every=1)
    with pytest.raises(ValueError, match="k: must be in"):
        SpecPolicy(2).observe_step(1, 3, 1.0, 1.0)
