"""Synthetic agent conversations: growing contexts, think and tool-call pauses, optional subagents.

Turn ``k`` of a session sends the whole conversation so far::

    turn 0:  | message 0 (first_len) |
    turn 1:  | message 0 | reply 0 (output_len) | message 1 (turn_len) |
    turn 2:  | message 0 | reply 0 | message 1 | reply 1 | message 2 |

so each prompt extends the previous one (the server can reuse all of it but the newest message and
the reply, whose synthetic ids differ from what the model really generated). A subagent spawned
after turn ``k`` starts from the parent's context at that point (prompt ``k`` and reply ``k``)
followed by its own task message, then grows the same way; the parent's turn ``k + 1`` waits for it.
"""

from collections.abc import Callable
from dataclasses import dataclass

from loadtest.workload import Session, Turn, Workload
from loadtest.workloads.synthetic import check_positive
from loadtest.workloads.tokens import DEFAULT_LOW_ID, token_stream


@dataclass(frozen=True)
class _Shape:
    """The knobs every conversation of one workload shares."""

    turn_len: int
    output_len: int
    think_time_s: float
    tool_call_every: int
    tool_time_s: float
    vocab: int
    low: int


def _conversation(
    session_id: str,
    key: list,
    context: tuple[int, ...],
    first_len: int,
    num_turns: int,
    shape: _Shape,
    spawn: Callable[[int, tuple[int, ...]], tuple[Session, ...]] | None,
) -> Session:
    """A session of ``num_turns`` turns after ``context``; ``spawn(k, context)`` gives turn k's subagents."""
    turns = []
    prompt = context
    reply: tuple[int, ...] = ()
    for k in range(num_turns):
        length = first_len if k == 0 else shape.turn_len
        prompt = prompt + reply + token_stream([*key, "message", k], length, shape.vocab, shape.low)
        tool_call = k > 0 and shape.tool_call_every > 0 and k % shape.tool_call_every == 0
        delay = 0.0 if k == 0 else (shape.tool_time_s if tool_call else shape.think_time_s)
        reply = token_stream([*key, "reply", k], shape.output_len, shape.vocab, shape.low)
        subagents = spawn(k, prompt + reply) if spawn is not None else ()
        turns.append(Turn(prompt, shape.output_len, delay_s=delay, subagents=subagents))
    return Session(session_id, tuple(turns))


def _spawner(
    session_id: str, key: list, turns: int, every: int, fanout: int, subagent_turns: int, shape: _Shape
) -> Callable[[int, tuple[int, ...]], tuple[Session, ...]]:
    """``spawn(k, context)`` for one parent session: numbers its subagents 1, 2, ... in spawn order."""
    spawned = 0

    def spawn(k: int, context: tuple[int, ...]) -> tuple[Session, ...]:
        nonlocal spawned
        if every == 0 or (k + 1) % every != 0 or k == turns - 1:
            return ()
        children = []
        for _ in range(fanout):
            spawned += 1
            child_id, child_key = f"{session_id}/sub-{spawned}", [*key, "sub", spawned]
            child = _conversation(child_id, child_key, context, shape.turn_len, subagent_turns, shape, None)
            children.append(child)
        return tuple(children)

    return spawn


def multiturn(
    num_sessions: int,
    turns: int,
    first_len: int,
    turn_len: int,
    output_len: int,
    think_time_s: float,
    tool_call_every: int,
    tool_time_s: float,
    vocab: int,
    seed: int = 0,
    *,
    subagent_every: int = 0,
    subagent_turns: int = 2,
    subagent_fanout: int = 1,
    low: int = DEFAULT_LOW_ID,
) -> Workload:
    """``num_sessions`` conversations of ``turns`` turns each.

    Args:
        first_len: ids of the first message (system prompt and task).
        turn_len: ids of every later message (a user message or a tool result).
        output_len: ``max_tokens`` of every turn, and the length of the synthetic reply put in the
            next prompt.
        think_time_s: ``delay_s`` of a turn after a user message.
        tool_call_every: turn ``k`` (``k >= 1``) answers a tool call when ``k % tool_call_every == 0``
            (0: never); its ``delay_s`` is ``tool_time_s`` instead of the think time.
        subagent_every: turn ``k`` spawns subagents when ``(k + 1) % subagent_every == 0`` (0: never;
            the last turn spawns none, as nothing would wait for them).
        subagent_turns: turns of each subagent session.
        subagent_fanout: subagents spawned together (the parent waits for all of them).
        vocab, low, seed: as for ``synthetic``.

    Returns:
        Sessions ``multiturn-<i>`` with subagents ``multiturn-<i>/sub-<n>`` (``n`` from 1 in spawn
        order), no arrival times; the first turn of every session has ``delay_s == 0``.
    """
    check_positive(
        num_sessions=num_sessions,
        turns=turns,
        first_len=first_len,
        turn_len=turn_len,
        output_len=output_len,
        subagent_turns=subagent_turns,
        subagent_fanout=subagent_fanout,
    )
    for name, value in (("think_time_s", think_time_s), ("tool_time_s", tool_time_s)):
        if not value >= 0:
            raise ValueError(f"{name}: must be >= 0, got {value!r}")
    for name, value in (("tool_call_every", tool_call_every), ("subagent_every", subagent_every)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}: must be an integer >= 0, got {value!r}")
    shape = _Shape(turn_len, output_len, float(think_time_s), tool_call_every, float(tool_time_s), vocab, low)

    sessions = []
    for index in range(num_sessions):
        session_id, key = f"multiturn-{index}", ["multiturn", seed, index]
        spawn = _spawner(session_id, key, turns, subagent_every, subagent_fanout, subagent_turns, shape)
        sessions.append(_conversation(session_id, key, (), first_len, turns, shape, spawn))
    workload = Workload(
        name="multiturn",
        sessions=tuple(sessions),
        description=(
            f"{num_sessions} sessions x {turns} turns: {first_len} then +{turn_len} tokens a turn, "
            f"{output_len} out"
        ),
        meta={
            "kind": "multiturn",
            "num_sessions": num_sessions,
            "turns": turns,
            "first_len": first_len,
            "turn_len": turn_len,
            "output_len": output_len,
            "think_time_s": think_time_s,
            "tool_call_every": tool_call_every,
            "tool_time_s": tool_time_s,
            "subagent_every": subagent_every,
            "subagent_turns": subagent_turns,
            "subagent_fanout": subagent_fanout,
            "vocab": vocab,
            "low": low,
            "seed": seed,
        },
    )
    workload.meta["subagents"] = len(workload.all_sessions()) - num_sessions
    return workload
