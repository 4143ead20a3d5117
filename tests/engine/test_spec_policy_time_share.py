"""``SpecPolicy`` driven from a fresh start over 2,000 decisions on scripted step costs and random
acceptance (seeded): where a verify step costs 70 plain steps the time spent in options other than the
best (warm-up and exploration) stays bounded, and where verifies are cheap and acceptance high the
policy settles on the best ``k``."""

import random

from services.engine.speculative.spec_policy import PLAIN, SpecPolicy

K = 4
BATCH = 8
DECISIONS = 2000


def accepted(rng: random.Random, drafted: int, alpha: float) -> int:
    """Drafts accepted in one verify when each is accepted with probability ``alpha``."""
    count = 0
    while count < drafted and rng.random() < alpha:
        count += 1
    return count


def simulate(policy: SpecPolicy, plain: float, step, alpha: float) -> list[tuple[int, float, bool]]:
    """``DECISIONS`` steps of ``BATCH`` requests: ``(k, seconds, in the warm-up)`` each; a plain step
    costs ``plain``, a step at ``k`` ``step(k) = (target seconds, draft seconds)``."""
    rng = random.Random(0)
    steps = []
    for _ in range(DECISIONS):
        warming = not policy.warmed_up
        k = policy.choose(BATCH)
        target, draft = (plain, 0.0) if k == PLAIN else step(k)
        policy.observe_step(BATCH, k, target, draft)
        if k:
            policy.observe_verifies([(k, accepted(rng, k, alpha)) for _ in range(BATCH)])
        steps.append((k, target + draft, warming and not policy.warmed_up))
    return steps


def share_outside(steps: list[tuple[int, float, bool]], best: int) -> float:
    return sum(seconds for k, seconds, _ in steps if k != best) / sum(seconds for _, seconds, _ in steps)


def test_verifies_costing_70_plain_steps_spend_a_bounded_share_outside_plain_steps():
    """Plain 1 ms, a verify step with its drafts 70 ms, acceptance 0.5 (E_4 = 1.94 tokens: drafting
    loses 36x). The warm-up stops after 4 verify steps and a plain step (281 ms); after it, each
    exploration waits 16 x its 70 ms: at most 1/17 of the time. Bound over all 2,000 decisions: under
    20% of the time outside plain steps (the rule before this one, a 16-verify warm-up and every 16th
    decision exploring, spent over 80% there)."""
    policy = SpecPolicy(K)
    steps = simulate(policy, plain=1e-3, step=lambda k: (60e-3, 10e-3), alpha=0.5)
    assert policy.best(BATCH) == PLAIN
    warm_up = [k for k, _, warming in steps if warming]
    assert warm_up == [K] * 4 + [PLAIN]
    after = steps[len(warm_up) :]
    assert any(k != PLAIN for k, _, _ in after)  # exploration ran
    assert share_outside(after, PLAIN) <= 1 / 17
    assert share_outside(steps, PLAIN) < 0.2


def test_cheap_verifies_and_high_acceptance_settle_on_the_best_k():
    """Plain 1, a verify at k 1 + 0.05 k, its drafts 0.1 k^2, acceptance 0.9: tokens per second 1.65,
    1.81, 1.68, 1.46 at k = 1..4 against 1 plainly: after the full warm-up (16 verify steps at K, a
    plain step after the 4th) the policy drafts 2, leaving it only to explore (at most one decision in
    16)."""
    policy = SpecPolicy(K)
    steps = simulate(policy, plain=1.0, step=lambda k: (1.0 + 0.05 * k, 0.1 * k * k), alpha=0.9)
    assert policy.best(BATCH) == 2
    warm_up = [k for k, _, warming in steps if warming]
    assert warm_up == [K] * 4 + [PLAIN] + [K] * 12
    last = [k for k, _, _ in steps[-1000:]]
    assert set(last) == {PLAIN, 1, 2, 3, K}  # every other option is still timed now and then
    assert last.count(2) >= 1000 * (1 - 1 / 16)
