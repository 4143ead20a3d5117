"""The contract between the engine and whatever drafts tokens for it.

Per engine step, for every running request past its prompt, a ``DraftProposer`` proposes ``k`` tokens
(``num_draft_tokens``, or fewer where ``SpecPolicy`` shrinks it for the step; none in a plain step)
that follow the request's known tokens (``Request.all_ids``); the target verifies them in one step
(the request's uncomputed tokens then the ``k`` drafts, ``1 + k`` logit rows at the end), accepts a
prefix of them and adds one token of its own; the proposer is then told how many it accepted.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from services.engine.request import Request


@dataclass(frozen=True)
class DraftTokens:
    """The tokens drafted after one request's known tokens.

    Attributes:
        token_ids: the ``k`` drafted tokens, in order (``k >= 1``).
        probs: ``[k, vocab]`` float32: row ``i`` is the distribution ``token_ids[i]`` was drawn from,
            after the request's temperature, top-k, top-p and min-p (what rejection sampling divides
            by); None for a greedy request (temperature 0), whose drafts are compared, not weighed.
    """

    token_ids: tuple[int, ...]
    probs: torch.Tensor | None = None


class DraftProposer(ABC):
    """Drafts up to ``num_draft_tokens`` tokens per request and tracks what the target accepted.

    A proposer keeps whatever per-request state it needs (a draft model's cache) from the first
    ``propose`` that names a request until ``release``.
    """

    num_draft_tokens: int

    @abstractmethod
    def propose(self, requests: list[Request], num_tokens: int | None = None) -> dict[str, DraftTokens]:
        """Draft ``num_tokens`` (None: ``num_draft_tokens``; else 1 to it) for each of ``requests``
        (running, every prompt token known, at least one generated).

        Returns:
            ``request_id -> DraftTokens`` with exactly ``num_tokens`` tokens each; a request left out
            decodes one token this step without drafts.

        Raises:
            ValueError: ``num_tokens`` outside ``[1, num_draft_tokens]``.
        """

    def draft_length(self, num_tokens: int | None) -> int:
        """``num_tokens`` checked against ``num_draft_tokens`` (None: all of them)."""
        if num_tokens is None:
            return self.num_draft_tokens
        if not 1 <= num_tokens <= self.num_draft_tokens:
            raise ValueError(f"num_tokens: must be in [1, {self.num_draft_tokens}], got {num_tokens}")
        return num_tokens

    @abstractmethod
    def commit(self, request: Request, num_accepted: int) -> None:
        """The target accepted the first ``num_accepted`` of the request's last drafts; its
        ``output_ids`` already end with them and the target's own next token."""

    @abstractmethod
    def discard(self, request: Request) -> None:
        """The request's last drafts were not verified (they did not fit the step): forget them and
        keep its state, so the next ``propose`` continues from what is certain. Unknown ids, or a
        request with no pending drafts, are ignored."""

    @abstractmethod
    def release(self, request_id: str) -> None:
        """Forget the request (finished, aborted or preempted): free what it held. Unknown ids are
        ignored."""

    @abstractmethod
    def check_integrity(self) -> None:
        """The proposer's pools are consistent (raises AssertionError otherwise)."""
