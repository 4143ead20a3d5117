"""``SpecPolicy`` on synthetic step times and acceptance (no clock, no model): the warm-up (a plain step,
then ``K``; stopped early where drafting ``K`` loses), the rule picks 0 where verify + draft cost more
than the tokens they add and the best ``k`` otherwise, the margin, cost-aware exploration of the untried
then the stalest option, buckets by powers of two, and acceptance by position."""

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


def warm_up_steps(policy: SpecPolicy, verify_steps: int, target: float, accepted: int) -> None:
    """``verify_steps`` warm-up decisions that must draft ``K``, each timed (``target`` and a draft of
    1 s) with ``BATCH`` verifies accepting ``accepted``."""
    for _ in range(verify_steps):
        assert policy.choose(BATCH) == K
        policy.observe_step(BATCH, K, target, 1.0)
        policy.observe_verifies([(K, accepted)] * BATCH)


def test_warm_up_drafts_k_times_a_plain_step_after_4_verify_steps_then_runs_to_16():
    """E_K = 2 tokens for 2 plain steps' time: no loss to stop early on."""
    policy = SpecPolicy(K)
    warm_up_steps(policy, 4, target=1.0, accepted=1)
    assert policy.choose(BATCH) == PLAIN  # the bucket times a plain step
    policy.observe_step(BATCH, PLAIN, 1.0, 0.0)
    warm_up_steps(policy, 12, target=1.0, accepted=1)
    assert not policy.warmed_up
    policy.choose(BATCH)
    assert policy.warmed_up  # the rule decides from here


def test_warm_up_stops_after_4_verify_steps_where_drafting_k_loses_more_than_half():
    """One token per verify for 11 plain steps' time: 91% lost; once the plain step is timed the rule
    decides (plain; a step at 1..K-1 waits for 16 x 11 s of plain steps)."""
    policy = SpecPolicy(K)
    warm_up_steps(policy, 4, target=10.0, accepted=0)
    assert policy.choose(BATCH) == PLAIN
    policy.observe_step(BATCH, PLAIN, 1.0, 0.0)
    assert decide(policy, 170) == [PLAIN] * 170
    assert policy.warmed_up and policy.verify_steps == 4 and policy.best(BATCH) == PLAIN


def test_warm_up_without_a_timed_plain_step_runs_16_verify_steps():
    """The plain step had a prompt chunk in it (not timed): no measured loss, so no early stop."""
    policy = SpecPolicy(K)
    warm_up_steps(policy, 4, target=10.0, accepted=0)
    assert policy.choose(BATCH) == PLAIN
    warm_up_steps(policy, 12, target=10.0, accepted=0)
    assert not policy.warmed_up


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


def test_exploration_waits_16_times_the_explored_steps_cost_then_takes_the_stalest():
    """Off (plain steps of 1 s win over verify steps of 2 s): the options the warm-up did not time
    (1..K-1) are tried one at a time, each once 16 x 2 s of other steps have passed since the last
    exploration; then the option used longest ago (K) on the same terms."""
    policy = warmed(0.0)
    policy.observe_step(BATCH, PLAIN, 1.0, 0.0)  # the warm-up timed plain and K
    policy.observe_step(BATCH, K, 1.0, 1.0)
    chosen = []
    for _ in range(132):
        k = policy.choose(BATCH)
        chosen.append(k)
        policy.observe_step(BATCH, k, 1.0, 1.0 if k else 0.0)
    explored = {decision: k for decision, k in enumerate(chosen, 1) if k != PLAIN}
    assert explored == {33: 1, 66: 2, 99: 3, 132: K}


def test_while_speculating_a_plain_step_is_timed_every_n_decisions():
    """Steps within 40% of each other: the time condition (16 x the explored step's cost) is met
    before the decisions' (16 since the last exploration), which then sets the pace."""
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
    with pytest.raises(ValueError, match="min_warmup_verify_steps"):
        SpecPolicy(2, warmup_verify_steps=3, min_warmup_verify_steps=4)
    with pytest.raises(ValueError, match="warmup_max_loss"):
        SpecPolicy(2, warmup_max_loss=1.0)
    with pytest.raises(ValueError, match="k: must be in"):
        SpecPolicy(2).observe_step(1, 3, 1.0, 1.0)
