"""``SpecPolicy``: how many tokens to draft in the next step (0: a plain step, no draft forward), chosen
from what this engine measured.

Speculating pays when the tokens a verify step emits outweigh what it and the draft cost more than a
plain decode step; at large batches (the step compute-bound) or low acceptance it loses. The policy
keeps, per batch-size bucket (the number of draftable requests rounded down to a power of two):

- EMAs of the target's step time for plain steps (``k = 0``) and verify steps (per ``k``), and of the
  draft's time per step (per ``k``), from decode-only steps (no prompt chunk in them);
- acceptance by draft position, over all buckets: ``alpha_i`` = P(draft ``i`` accepted | the ``i - 1``
  before it were), an EMA of each step's rate at that position.

The expected tokens a verify at ``k`` emits per request are ``E_k = 1 + sum_{j=1..k} prod_{i<=j}
alpha_i``; the rule picks the measured ``k`` maximising ``E_k / (t_verify(k) + t_draft(k))`` and takes
it when that beats a plain step's ``1 / t_plain`` by ``margin``, else 0. The first ``warmup_verify_steps``
verify steps draft ``K`` (the fixed behaviour). After that, a bucket first tries each option (0..K)
it has not used yet, in that order, one step each; then every ``explore_every``-th decision tries the
option (not the current best) used longest ago, so a plain step is timed while speculating and a
speculative one while off. A bucket without both a plain and a speculative measurement (a tried step
that had a prompt chunk in it is not timed) drafts ``K``.
"""

from dataclasses import dataclass, field

PLAIN = 0  # k of a step without drafts


def bucket_of(batch_size: int) -> int:
    """The power of two at or below ``batch_size`` (>= 1): the bucket its step times are kept in."""
    if batch_size < 1:
        raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
    return 1 << (batch_size.bit_length() - 1)


def _smoothed(old: float | None, new: float, weight: float) -> float:
    return new if old is None else old + weight * (new - old)


@dataclass
class BucketCosts:
    """One batch-size bucket's measurements.

    Attributes:
        target_seconds: ``k -> EMA`` of the target's step time (``k = 0``: plain steps).
        draft_seconds: ``k -> EMA`` of the draft's time per step (``k >= 1``).
        used_at: ``k -> decisions`` (below) when ``k`` was last chosen or timed.
        decisions: steps the policy decided for this bucket after the warm-up.
    """

    target_seconds: dict[int, float] = field(default_factory=dict)
    draft_seconds: dict[int, float] = field(default_factory=dict)
    used_at: dict[int, int] = field(default_factory=dict)
    decisions: int = 0

    def step_seconds(self, k: int) -> float | None:
        """A step's cost at ``k`` (target, and draft for ``k >= 1``); None while unmeasured."""
        if k not in self.target_seconds:
            return None
        return self.target_seconds[k] + (self.draft_seconds[k] if k != PLAIN else 0.0)


class SpecPolicy:
    """Chooses each step's ``k`` in ``0..num_draft_tokens`` (module docstring: the rule).

    Args:
        num_draft_tokens: ``K``, the most drafts per request (``--num-draft-tokens``).
        margin: how much more a speculative step's tokens per second must give than a plain step's.
        warmup_verify_steps: verify steps drafting ``K`` before the rule decides.
        explore_every: a bucket tries its stalest option once in this many decisions.
        smoothing: the EMAs' weight of a new measurement.

    The engine calls ``choose`` before drafting, then ``observe_step`` with the step's times (decode-only
    steps) and ``observe_verifies`` with its verifies.
    """

    def __init__(
        self,
        num_draft_tokens: int,
        margin: float = 0.05,
        warmup_verify_steps: int = 16,
        explore_every: int = 16,
        smoothing: float = 0.2,
    ):
        if num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens: must be >= 1 for a policy, got {num_draft_tokens}")
        if explore_every < 2:
            raise ValueError(f"explore_every: must be >= 2, got {explore_every}")
        self.num_draft_tokens = num_draft_tokens
        self.margin = margin
        self.warmup_verify_steps = warmup_verify_steps
        self.explore_every = explore_every
        self.smoothing = smoothing
        self.verify_steps = 0
        self.alpha: list[float | None] = [None] * num_draft_tokens
        self.buckets: dict[int, BucketCosts] = {}

    def choose(self, batch_size: int) -> int:
        """The drafts per request for a step of ``batch_size`` draftable requests (0: a plain step)."""
        if self.verify_steps < self.warmup_verify_steps:
            return self.num_draft_tokens
        costs = self.buckets.setdefault(bucket_of(batch_size), BucketCosts())
        costs.decisions += 1
        options = range(self.num_draft_tokens + 1)
        best = self.best(batch_size)
        if best is None:  # no rule without both arms timed: fixed, until exploration times the other
            best = self.num_draft_tokens
        untried = [k for k in options if k not in costs.used_at]
        if untried:
            k = untried[0]
        elif costs.decisions % self.explore_every == 0:
            k = min((k for k in options if k != best), key=costs.used_at.__getitem__)
        else:
            k = best
        costs.used_at[k] = costs.decisions
        return k

    def best(self, batch_size: int) -> int | None:
        """The rule on ``batch_size``'s bucket: the measured ``k`` of most expected tokens per second if
        it beats a plain step's by ``margin``, else 0; None while the bucket lacks a plain or any
        speculative measurement."""
        costs = self.buckets.get(bucket_of(batch_size))
        plain = costs.step_seconds(PLAIN) if costs is not None else None
        if plain is None:
            return None
        rates = {}
        for k in range(1, self.num_draft_tokens + 1):
            seconds = costs.step_seconds(k)
            if seconds is not None:
                rates[k] = self.expected_tokens(k) / seconds
        if not rates:
            return None
        k = max(rates, key=rates.__getitem__)
        return k if rates[k] > (1 + self.margin) / plain else PLAIN

    def expected_tokens(self, k: int) -> float:
        """``E_k``: tokens a verify of ``k`` drafts emits per request, from the acceptance by position
        (a position never reached takes the one before it; none measured: 0)."""
        expected, reach, alpha = 1.0, 1.0, 0.0
        for position in range(k):
            measured = self.alpha[position]
            alpha = measured if measured is not None else alpha
            reach *= alpha
            expected += reach
        return expected

    def observe_step(self, batch_size: int, k: int, target_seconds: float, draft_seconds: float) -> None:
        """A decode-only step of ``batch_size`` draftable requests at ``k``: the target's time and the
        draft's (0 for a plain step)."""
        if not 0 <= k <= self.num_draft_tokens:
            raise ValueError(f"k: must be in [0, {self.num_draft_tokens}], got {k}")
        costs = self.buckets.setdefault(bucket_of(batch_size), BucketCosts())
        costs.target_seconds[k] = _smoothed(costs.target_seconds.get(k), target_seconds, self.smoothing)
        if k != PLAIN:
            costs.draft_seconds[k] = _smoothed(costs.draft_seconds.get(k), draft_seconds, self.smoothing)
        costs.used_at[k] = costs.decisions

    def observe_verifies(self, verifies: list[tuple[int, int]]) -> None:
        """One step's verifies, ``(num_drafted, num_accepted)`` each: the acceptance rate at each
        position among the verifies that reached it (every draft before it accepted)."""
        if not verifies:
            return
        self.verify_steps += 1
        for position in range(self.num_draft_tokens):
            reached = [
                accepted > position
                for drafted, accepted in verifies
                if drafted > position and accepted >= position
            ]
            if reached:
                rate = sum(reached) / len(reached)
                self.alpha[position] = _smoothed(self.alpha[position], rate, self.smoothing)
