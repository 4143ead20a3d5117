"""``SpecPolicy``: how many tokens to draft in the next step (0: a plain step, no draft forward), chosen
from what this engine measured, with the time spent finding out bounded.

Speculating pays when the tokens a verify step emits outweigh what it and the draft cost more than a
plain decode step; at large batches (the step compute-bound) or low acceptance it loses, and a verify
step that runs eagerly can cost tens of plain steps that replay CUDA graphs. The policy keeps, per
batch-size bucket (the number of draftable requests rounded down to a power of two):

- EMAs of the target's step time for plain steps (``k = 0``) and verify steps (per ``k``), and of the
  draft's time per step (per ``k``), from decode-only steps (no prompt chunk in them);
- the bucket's clock: the sum over its decisions of the chosen option's estimated step time (its EMA
  when the decision was made; an option not yet timed adds nothing);
- acceptance by draft position, over all buckets: ``alpha_i`` = P(draft ``i`` accepted | the ``i - 1``
  before it were), an EMA of each step's rate at that position.

The expected tokens a verify at ``k`` emits per request are ``E_k = 1 + sum_{j=1..k} prod_{i<=j}
alpha_i``; the rule picks the measured ``k`` maximising ``E_k / (t_verify(k) + t_draft(k))`` and takes
it when that beats a plain step's ``1 / t_plain`` by ``margin``, else 0. A bucket without both a plain
and a speculative measurement (a step that had a prompt chunk in it is not timed) drafts ``K``.

Warm-up (global, before the rule decides): steps draft ``K`` (short runs draft every step, as the fixed
policy does); once ``min_warmup_verify_steps`` verify steps have run (a first acceptance estimate), a
bucket's next decision is a plain step if it has not taken one (to time it). The warm-up ends after
``warmup_verify_steps`` verify steps, or earlier once the deciding bucket's measurements show drafting
``K`` losing more than ``warmup_max_loss`` of the time: ``E_K * t_plain < (1 - warmup_max_loss) *
t_step(K)``, i.e. the same tokens decoded plainly would take less than half the time.

Exploration (after the warm-up), cost-aware: a bucket's next option to explore is the first option (0..K)
it has not used, else the option (not the current best) used longest ago. It is taken once the bucket's
clock has advanced by at least ``explore_every`` times that option's estimated step time since the
previous exploration (the warm-up counts as one); an option not yet timed is estimated at the bucket's
dearest measured option (at 0, tried at once, when none is measured); an option tried before also waits
for ``explore_every`` decisions (the bound where steps are cheap or not timed). So each exploration step
of cost ``c`` follows at least ``explore_every * c`` of other time: exploring takes at most ``1 /
(explore_every + 1)`` of a bucket's time after the warm-up, whatever a speculative step costs against a
plain one, and a plain step is still timed while speculating and a speculative one while off.
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
        seconds: the bucket's clock, the estimated time of every step decided for it.
        explored_at: ``seconds`` at the end of the last exploration (or of the warm-up).
        explored_decision: ``decisions`` at the last exploration.
    """

    target_seconds: dict[int, float] = field(default_factory=dict)
    draft_seconds: dict[int, float] = field(default_factory=dict)
    used_at: dict[int, int] = field(default_factory=dict)
    decisions: int = 0
    seconds: float = 0.0
    explored_at: float = 0.0
    explored_decision: int = 0

    def step_seconds(self, k: int) -> float | None:
        """A step's cost at ``k`` (target, and draft for ``k >= 1``); None while unmeasured."""
        if k not in self.target_seconds:
            return None
        return self.target_seconds[k] + (self.draft_seconds[k] if k != PLAIN else 0.0)

    def estimated_seconds(self, k: int) -> float:
        """``k``'s step cost, or while unmeasured the dearest measured option's (0.0: none measured)."""
        seconds = self.step_seconds(k)
        if seconds is not None:
            return seconds
        return max((self.step_seconds(option) for option in self.target_seconds), default=0.0)

    def decided(self, k: int) -> None:
        """Advance the clock by a step at ``k`` and mark ``k`` used now."""
        self.seconds += self.estimated_seconds(k)
        self.used_at[k] = self.decisions


class SpecPolicy:
    """Chooses each step's ``k`` in ``0..num_draft_tokens`` (module docstring: the rule).

    Args:
        num_draft_tokens: ``K``, the most drafts per request (``--num-draft-tokens``).
        margin: how much more a speculative step's tokens per second must give than a plain step's.
        warmup_verify_steps: verify steps drafting ``K`` before the rule decides.
        min_warmup_verify_steps: verify steps the warm-up keeps even where drafting ``K`` loses.
        warmup_max_loss: the share of the time drafting ``K`` may lose against plain steps before the
            warm-up stops early.
        explore_every: an exploration step of cost ``c`` waits for ``explore_every * c`` of the
            bucket's time since the last one.
        smoothing: the EMAs' weight of a new measurement.

    The engine calls ``choose`` before drafting, then ``observe_step`` with the step's times (decode-only
    steps) and ``observe_verifies`` with its verifies.
    """

    def __init__(
        self,
        num_draft_tokens: int,
        margin: float = 0.05,
        warmup_verify_steps: int = 16,
        min_warmup_verify_steps: int = 4,
        warmup_max_loss: float = 0.5,
        explore_every: int = 16,
        smoothing: float = 0.2,
    ):
        if num_draft_tokens < 1:
            raise ValueError(f"num_draft_tokens: must be >= 1 for a policy, got {num_draft_tokens}")
        if explore_every < 2:
            raise ValueError(f"explore_every: must be >= 2, got {explore_every}")
        if not 1 <= min_warmup_verify_steps <= warmup_verify_steps:
            raise ValueError(
                f"min_warmup_verify_steps: must be in [1, warmup_verify_steps = {warmup_verify_steps}], "
                f"got {min_warmup_verify_steps}"
            )
        if not 0 < warmup_max_loss < 1:
            raise ValueError(f"warmup_max_loss: must be in (0, 1), got {warmup_max_loss}")
        self.num_draft_tokens = num_draft_tokens
        self.margin = margin
        self.warmup_verify_steps = warmup_verify_steps
        self.min_warmup_verify_steps = min_warmup_verify_steps
        self.warmup_max_loss = warmup_max_loss
        self.explore_every = explore_every
        self.smoothing = smoothing
        self.verify_steps = 0
        self.warmed_up = False
        self.alpha: list[float | None] = [None] * num_draft_tokens
        self.buckets: dict[int, BucketCosts] = {}

    def choose(self, batch_size: int) -> int:
        """The drafts per request for a step of ``batch_size`` draftable requests (0: a plain step)."""
        costs = self.buckets.setdefault(bucket_of(batch_size), BucketCosts())
        if self._warming_up(costs):
            timing_plain = self.verify_steps >= self.min_warmup_verify_steps and PLAIN not in costs.used_at
            k = PLAIN if timing_plain else self.num_draft_tokens
            costs.decided(k)
            costs.explored_at = costs.seconds
            return k
        costs.decisions += 1
        options = range(self.num_draft_tokens + 1)
        best = self.best(batch_size)
        if best is None:  # no rule without both arms timed: fixed, until exploration times the other
            best = self.num_draft_tokens
        untried = [k for k in options if k not in costs.used_at]
        candidate = (
            untried[0] if untried else min((k for k in options if k != best), key=costs.used_at.__getitem__)
        )
        due = costs.seconds - costs.explored_at >= self.explore_every * costs.estimated_seconds(candidate)
        if candidate not in untried:  # and where steps are cheap or untimed, no more often than before
            due = due and costs.decisions - costs.explored_decision >= self.explore_every
        k = candidate if due else best
        costs.decided(k)
        if due:
            costs.explored_at, costs.explored_decision = costs.seconds, costs.decisions
        return k

    def _warming_up(self, costs: BucketCosts) -> bool:
        """Whether the warm-up still runs (ending it, for good, when this bucket shows it should)."""
        if self.warmed_up:
            return False
        if self.verify_steps >= self.warmup_verify_steps or (
            self.verify_steps >= self.min_warmup_verify_steps and self._warmup_losing(costs)
        ):
            self.warmed_up = True
        return not self.warmed_up

    def _warmup_losing(self, costs: BucketCosts) -> bool:
        """Whether drafting ``K`` loses more than ``warmup_max_loss`` of the time against plain steps."""
        plain, drafting = costs.step_seconds(PLAIN), costs.step_seconds(self.num_draft_tokens)
        if plain is None or drafting is None:
            return False
        return self.expected_tokens(self.num_draft_tokens) * plain < (1 - self.warmup_max_loss) * drafting

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
