"""Where a request's KDA state is snapshotted for the prefix cache (``docs/hicache.md``, "Snapshot
placement").

A hit can only reach a block boundary that has a snapshot (the hybrid rule), so snapshots go where a
later request is likely to resume::

    stride      every ``snapshot_stride`` blocks (the prompt's bulk: shared system prompts, documents)
    prompt_end  the prompt's last block boundary (a next turn extends this prompt)
    branch      the depth to which the prompt matched cached KV (device or host) beyond the snapshot it
                restored: where it branches off a cached prefix, so a sibling branching there resumes
    decode      each block boundary its generated tokens cross (on the device only); the last one is
                written back to the host tier when the turn ends (``turn_end``: the next turn's prompt
                is this turn's context plus new text)

A prefill chunk is cut at the next such point so the state there exists at the end of a step.
"""

from services.engine.request import Request

STRIDE, PROMPT_END, BRANCH, DECODE, TURN_END = "stride", "prompt_end", "branch", "decode", "turn_end"


class SnapshotPolicy:
    """The snapshot points of a request, in tokens.

    Args:
        block_tokens: positions one block id covers.
        stride: snapshot every this many blocks.
    """

    def __init__(self, block_tokens: int, stride: int):
        self.block_tokens = block_tokens
        self.stride_tokens = block_tokens * stride

    def reason(self, request: Request, position: int) -> str | None:
        """Why the state after ``position`` tokens of ``request`` is kept (the most specific reason), or
        None when no snapshot is due there."""
        if position <= 0 or position % self.block_tokens:
            return None
        if position == request.branch_tokens:
            return BRANCH
        if position == self._prompt_end(request):
            return PROMPT_END
        if position % self.stride_tokens == 0:
            return STRIDE
        if position > len(request.prompt_ids):
            return DECODE
        return None

    def next_point(self, request: Request, start: int, branch_tokens: int) -> int:
        """The first position after ``start`` where a prompt's snapshot is due (a chunk ends there);
        ``branch_tokens``: the request's branch point (``request.branch_tokens`` once admitted)."""
        points = [(start // self.stride_tokens + 1) * self.stride_tokens]
        points += [p for p in (branch_tokens, self._prompt_end(request)) if p > start]
        return min(points)

    def _prompt_end(self, request: Request) -> int:
        return len(request.prompt_ids) // self.block_tokens * self.block_tokens
