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

A prefill chunk is cut once, at the branch point when it crosses one, else at its last stride or
prompt-end point, so the state there exists at the end of a step.
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

    def cut_point(self, request: Request, start: int, end: int, branch_tokens: int) -> int | None:
        """Where a prefill chunk ``[start, end)`` ends so that a snapshot is due at its end, or None to run
        it whole: the branch point when the chunk crosses it (a sibling resumes there), else the chunk's
        last stride or prompt-end point. One cut per chunk: stride points inside a long chunk get no
        snapshot (splitting a prefill into a step per stride would cost a step each), only the last.
        ``branch_tokens``: the request's branch point (``request.branch_tokens`` once admitted)."""
        if start < branch_tokens < end:
            return branch_tokens
        last_stride = end // self.stride_tokens * self.stride_tokens
        deepest = max((p for p in (last_stride, self._prompt_end(request)) if start < p <= end), default=None)
        return None if deepest == end else deepest  # a chunk ending on a point needs no cut

    def _prompt_end(self, request: Request) -> int:
        return len(request.prompt_ids) // self.block_tokens * self.block_tokens
