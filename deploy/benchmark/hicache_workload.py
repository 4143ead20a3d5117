"""What ``baton bench hicache`` replays, and what it measures the tier against: a trace's requests in
arrival order, its working set in engine blocks, and which requests are later turns.

A trace replay (``loadtest.workloads.load_trace``) is a list of sessions; the benchmark sends every
request as its own one-turn session, in arrival order (``Turn.at_s``), so the sessions of a trace
interleave as they do in the trace (one long agent session never has the device pool to itself) and a
run of ``N`` requests is the trace's first ``N``. Each keeps its session id (the router's decode
affinity still groups a conversation's turns).

**Working set**: the distinct full engine blocks of every prompt, a block counted by its whole prefix
(block ``i`` of two prompts is the same block only when blocks ``0..i`` are equal), as the engine's
prefix cache keys them. This is what a pool would need to hold every prefix of the replay.

**Later turn**: a request whose prompt starts with more than one trace block of an earlier request's
prompt, i.e. the next turn of a conversation (Mooncake lines are one request each; this links them)
or of an agent session (WEKA). One shared trace block is not enough: every Mooncake line starts with
the same system block.

Two ways to give a short CPU replay the shape of a busy server:

- ``multi_turn_only``: keep only the requests of conversations that have a later turn: each later
  turn in order, with the request it continues. The Mooncake conversation trace has a later turn in
  about one line of six; a replay of its first lines would be mostly unrelated first turns.
- ``copies`` (WEKA): a WEKA file is one agent session whose context is about half of its working set,
  so a device pool that holds its longest request holds its whole working set. ``copies`` sessions of
  each file, salted apart (as many users running the same agent), take turns: copy 0's turn i, copy
  1's turn i, ..., so the device pool holds about one context of ``copies``.
"""

import math
from dataclasses import dataclass, replace

from loadtest.workload import Session, Workload


@dataclass(frozen=True)
class ReplayPlan:
    """A trace's first requests, one-turn sessions in arrival order, and what they share.

    Attributes:
        workload: the requests (``Workload``), sessions of one turn each.
        later: per request (in ``workload.sessions`` order), whether it is a later turn.
        working_set_blocks: distinct full prefix blocks of ``block_size`` tokens over every prompt.
        longest_tokens: the longest prompt plus its ``max_tokens``.
        block_size: the engine's tokens per block the working set was counted in.
    """

    workload: Workload
    later: tuple[bool, ...]
    working_set_blocks: int
    longest_tokens: int
    block_size: int

    @property
    def later_count(self) -> int:
        return sum(self.later)

    def pool_blocks(self, share: float) -> int:
        """A device pool of ``share`` of the working set, but never less than the longest request needs
        plus one block (the engine refuses a request longer than its whole pool)."""
        if not 0 < share <= 1:
            raise ValueError(f"--pool-share: must be in (0, 1], got {share}")
        needed = -(-self.longest_tokens // self.block_size) + 1
        return max(math.ceil(share * self.working_set_blocks), needed)


def replay_plan(
    workload: Workload,
    max_requests: int | None,
    block_size: int,
    multi_turn_only: bool = False,
    max_tokens: int | None = None,
) -> ReplayPlan:
    """The first ``max_requests`` requests of ``workload`` (None: all), subagents included.

    Args:
        workload: a trace replay; ``meta["scaled_block_size"]`` (Mooncake) or ``meta["scale"]`` with
            64-token WEKA blocks gives the trace block the later-turn rule uses.
        max_requests: requests kept, the earliest by ``at_s`` (file order among equal times).
        block_size: the engine's block size (tokens).
        multi_turn_only: first keep only the requests of conversations with a later turn (see the module).
        max_tokens: generate at most this many tokens per request (None: the trace's, scaled); the
            tier is about prompts, and a CPU replay spends its time decoding otherwise.

    Raises:
        ValueError: ``max_requests`` below 1 or a workload with no request, naming ``--requests``.
    """
    if max_requests is not None and max_requests < 1:
        raise ValueError(f"--requests: must be >= 1, got {max_requests}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"--max-tokens: must be >= 1, got {max_tokens}")

    def cap(tokens: int) -> int:
        return tokens if max_tokens is None else min(tokens, max_tokens)

    timed = [
        (turn.at_s or 0.0, order, session.session_id, turn)
        for order, (session, turn) in enumerate(
            (session, turn) for session in workload.all_sessions() for turn in session.turns
        )
    ]
    timed.sort(key=lambda item: (item[0], item[1]))
    if multi_turn_only:
        prompts = [item[3].prompt_ids for item in timed]
        timed = [timed[i] for i in conversation_requests(prompts, trace_block_tokens(workload), max_requests)]
    kept = timed[:max_requests]
    if not kept:
        raise ValueError(f"--requests: the trace {workload.name} has no request to replay")
    sessions = tuple(
        Session(
            session_id,
            (replace(turn, max_tokens=cap(turn.max_tokens), delay_s=0.0, at_s=None, subagents=()),),
        )
        for _, _, session_id, turn in kept
    )
    prompts = [session.turns[0].prompt_ids for session in sessions]
    return ReplayPlan(
        workload=replace(workload, sessions=sessions, meta=workload.meta | {"replayed_requests": len(kept)}),
        later=later_turns(prompts, trace_block_tokens(workload)),
        working_set_blocks=working_set_blocks(prompts, block_size),
        longest_tokens=max(len(s.turns[0].prompt_ids) + s.turns[0].max_tokens for s in sessions),
        block_size=block_size,
    )


def trace_block_tokens(workload: Workload) -> int:
    """Tokens per trace block after scaling: Mooncake's 512 or WEKA's 64, divided by the scale."""
    meta = workload.meta
    if "scaled_block_size" in meta:
        return meta["scaled_block_size"]
    trace_block = max(trace["block_size"] for trace in meta.get("traces", [{"block_size": 64}]))
    return max(1, trace_block // meta.get("scale", 1))


def _chain(prompt: tuple[int, ...], size: int) -> list[int]:
    """One hash per full ``size``-token block of ``prompt``, each covering the whole prefix up to it."""
    hashes, running = [], 0
    for start in range(0, len(prompt) - size + 1, size):
        running = hash((running, prompt[start : start + size]))
        hashes.append(running)
    return hashes


def working_set_blocks(prompts: list[tuple[int, ...]], block_size: int) -> int:
    """Distinct full prefix blocks of ``block_size`` tokens over ``prompts`` (see the module)."""
    return len({block for prompt in prompts for block in _chain(prompt, block_size)})


def conversation_requests(prompts: list[tuple[int, ...]], trace_block: int, limit: int | None) -> list[int]:
    """Indices (ascending) of the requests of conversations with a later turn: each later turn, in
    order, with the request it continues (the first that held its second trace block), until ``limit``
    requests (None: all)."""
    owner: dict[int, int] = {}
    chosen: set[int] = set()
    for index, (prompt, later) in enumerate(zip(prompts, later_turns(prompts, trace_block), strict=True)):
        if limit is not None and len(chosen) >= limit:
            break
        chain = _chain(prompt, trace_block)
        if later:
            chosen.update((owner[chain[1]], index))
        for block in chain:
            owner.setdefault(block, index)
    return sorted(chosen)


def later_turns(prompts: list[tuple[int, ...]], trace_block: int) -> tuple[bool, ...]:
    """Per prompt, whether it starts with more than one ``trace_block``-token block of an earlier one."""
    seen: set[int] = set()
    later = []
    for prompt in prompts:
        chain = _chain(prompt, trace_block)
        shared = 0
        while shared < len(chain) and chain[shared] in seen:
            shared += 1
        later.append(shared > 1)
        seen.update(chain)
    return tuple(later)
