"""Speculative decoding's counters: drafted and accepted tokens by draft position, accepted length
per verify, the time the draft and the target take, and the steps by how many tokens were drafted. The
engine loop adds to ``SpecCounters``; ``counts`` copies the totals (``SpecCounts``) for the worker's
metrics once per pass."""

from dataclasses import dataclass


@dataclass(frozen=True)
class SpecCounts:
    """Totals since the engine started.

    Attributes:
        num_draft_tokens: ``k``, drafts per verify (0: speculation off).
        verifies: verify steps of one request each.
        accepted_lengths: ``accepted_lengths[n]``: verifies that accepted exactly ``n`` drafts
            (``k + 1`` entries).
        drafted_by_position, accepted_by_position: per draft position ``i`` (0-based), drafts
            proposed there and drafts accepted there (``k`` entries each).
        draft_seconds, target_seconds: wall time of the draft's proposals and of the target's steps.
        draft_tokens: the ``k`` of the last step that had requests to draft for (0: a plain step).
        steps_by_draft_tokens: ``steps_by_draft_tokens[k]``: such steps drafting ``k`` per request
            (``k + 1`` entries; ``[0]``: plain steps the policy chose, ``docs/speculative.md``).
    """

    num_draft_tokens: int
    verifies: int
    accepted_lengths: tuple[int, ...]
    drafted_by_position: tuple[int, ...]
    accepted_by_position: tuple[int, ...]
    draft_seconds: float
    target_seconds: float
    draft_tokens: int = 0
    steps_by_draft_tokens: tuple[int, ...] = ()

    @property
    def mean_accepted(self) -> float:
        """Drafts accepted per verify (0.0 before the first verify)."""
        accepted = sum(length * count for length, count in enumerate(self.accepted_lengths))
        return accepted / self.verifies if self.verifies else 0.0


class SpecCounters:
    """The running counters of an engine drafting ``num_draft_tokens`` per verify."""

    def __init__(self, num_draft_tokens: int):
        self.num_draft_tokens = num_draft_tokens
        self.verifies = 0
        self.accepted_lengths = [0] * (num_draft_tokens + 1)
        self.drafted_by_position = [0] * num_draft_tokens
        self.accepted_by_position = [0] * num_draft_tokens
        self.draft_seconds = 0.0
        self.target_seconds = 0.0
        self.draft_tokens = num_draft_tokens
        self.steps_by_draft_tokens = [0] * (num_draft_tokens + 1)

    def verified(self, num_drafted: int, num_accepted: int) -> None:
        """One request's verify: ``num_drafted`` drafts (``k``, fewer near ``max_tokens``), of which
        the first ``num_accepted`` were accepted."""
        if not 0 <= num_accepted <= num_drafted <= self.num_draft_tokens:
            raise ValueError(
                f"num_accepted {num_accepted}, num_drafted {num_drafted}: need 0 <= accepted <= drafted "
                f"<= {self.num_draft_tokens}"
            )
        self.verifies += 1
        self.accepted_lengths[num_accepted] += 1
        for position in range(num_drafted):
            self.drafted_by_position[position] += 1
        for position in range(num_accepted):
            self.accepted_by_position[position] += 1

    def stepped(self, draft_tokens: int) -> None:
        """A step with requests to draft for drafted ``draft_tokens`` per request (0: none)."""
        if not 0 <= draft_tokens <= self.num_draft_tokens:
            raise ValueError(f"draft_tokens: must be in [0, {self.num_draft_tokens}], got {draft_tokens}")
        self.draft_tokens = draft_tokens
        self.steps_by_draft_tokens[draft_tokens] += 1

    def add_draft_seconds(self, seconds: float) -> None:
        self.draft_seconds += seconds

    def add_target_seconds(self, seconds: float) -> None:
        self.target_seconds += seconds

    def counts(self) -> SpecCounts:
        return SpecCounts(
            self.num_draft_tokens,
            self.verifies,
            tuple(self.accepted_lengths),
            tuple(self.drafted_by_position),
            tuple(self.accepted_by_position),
            self.draft_seconds,
            self.target_seconds,
            self.draft_tokens,
            tuple(self.steps_by_draft_tokens),
        )
