"""A test double for ``DraftProposer``: drafts a known continuation, with wrong tokens where told.

Each prompt's script is the plain engine's greedy continuation and the output positions whose draft is
made wrong; so the target rejects exactly there, and the accepted counts of a run can be predicted
(``expected_verifies``). It checks the engine keeps the contract: a request is proposed for again only
after ``commit`` or ``release``, and ``commit`` comes when its output ends with the accepted drafts and
one token more.
"""

from dataclasses import dataclass

from services.engine.request import Request
from services.engine.speculative.proposal import DraftProposer, DraftTokens


@dataclass(frozen=True)
class Script:
    """What to draft after one prompt.

    Attributes:
        continuation: the plain run's greedy output tokens.
        wrong: output positions whose draft is replaced by another token (rejected by the target).
    """

    continuation: tuple[int, ...]
    wrong: frozenset[int] = frozenset()


class ScriptedProposer(DraftProposer):
    """Drafts ``num_tokens`` (None: ``num_draft_tokens``) tokens of each prompt's ``Script`` (requests
    are matched by prompt; a prompt without a script gets no drafts).

    Attributes:
        proposals: the ``num_tokens`` asked for by every ``propose``, in order.
        commits: ``(request_id, num_accepted)`` of every ``commit``, in order.
        released: ids passed to ``release``.
        discarded: ids passed to ``discard``.
    """

    def __init__(self, num_draft_tokens: int, scripts: dict[tuple[int, ...], Script]):
        self.num_draft_tokens = num_draft_tokens
        self.scripts = scripts
        self.pending: dict[str, tuple[int, ...]] = {}  # drafts proposed, not yet committed or released
        self.proposals: list[int] = []
        self.commits: list[tuple[str, int]] = []
        self.released: list[str] = []
        self.discarded: list[str] = []

    def propose(self, requests: list[Request], num_tokens: int | None = None) -> dict[str, DraftTokens]:
        k = self.draft_length(num_tokens)
        self.proposals.append(k)
        drafts = {}
        for request in requests:
            assert request.request_id not in self.pending, "proposed again before commit or release"
            assert request.output_ids and request.num_computed >= len(request.prompt_ids)
            script = self.scripts.get(tuple(request.prompt_ids))
            if script is None:
                continue  # not scripted: it decodes without drafts
            start = len(request.output_ids)
            tokens = tuple(self._draft(script, start + i) for i in range(k))
            self.pending[request.request_id] = tokens
            drafts[request.request_id] = DraftTokens(tokens)
        return drafts

    def _draft(self, script: Script, position: int) -> int:
        right = script.continuation[position] if position < len(script.continuation) else 0
        if position not in script.wrong:
            return right
        return right - 1 if right > 0 else right + 1  # any other token of the vocabulary

    def commit(self, request: Request, num_accepted: int) -> None:
        drafts = self.pending.pop(request.request_id)
        assert 0 <= num_accepted <= len(drafts)
        emitted = request.output_ids[len(request.output_ids) - num_accepted - 1 :]
        assert tuple(emitted[:num_accepted]) == drafts[:num_accepted], "output does not end with the drafts"
        self.commits.append((request.request_id, num_accepted))

    def discard(self, request: Request) -> None:
        self.pending.pop(request.request_id, None)
        self.discarded.append(request.request_id)

    def release(self, request_id: str) -> None:
        self.pending.pop(request_id, None)
        self.released.append(request_id)

    def check_integrity(self) -> None:
        assert all(1 <= len(d) <= self.num_draft_tokens for d in self.pending.values())


def expected_verifies(script: Script, k: int, max_tokens: int) -> list[tuple[int, int]]:
    """``(num_drafted, num_accepted)`` of each verify of a request run alone to ``max_tokens`` (no
    stop), with budget to spare: the first token comes from the prefill, then each step drafts what
    ``max_tokens`` leaves room for (none when only one token is left: a plain decode)."""
    verifies, generated = [], 1
    while generated < max_tokens:
        drafted = min(k, max_tokens - generated - 1)
        if drafted == 0:
            generated += 1
            continue
        accepted = next((i for i in range(drafted) if generated + i in script.wrong), drafted)
        verifies.append((drafted, accepted))
        generated += accepted + 1
    return verifies
