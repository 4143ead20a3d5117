"""Replay of WEKA agentic traces (callanjfox/kv-cache-tester ``traces/``): one coding session a file.

A file is ``{"id", "block_size": 64, "hash_id_scope", "requests": [...]}``. A request is
``{"t": s, "type": "n" | "s", "in", "out", "hash_ids", "think_time", "api_time", ...}`` ("n" and "s"
are non-streaming and streaming API calls; both are plain turns here) with one hash id per whole
64-token block (``len(hash_ids) == in // 64``). A ``{"type": "subagent", "t": s, "requests": [...]}``
entry is a subagent the agent spawned, its own requests timed from its start (``t`` relative).

Mapping to ``Workload``::

    requests: [ r0, r1, sub A, sub B, r2 ]   ->   Session(trace_id):
                                                    turn r0
                                                    turn r1, subagents (trace_id/sub-1, trace_id/sub-2)
                                                    turn r2  (waits for both subagents)

- ``at_s`` = the request's absolute ``t`` (a subagent's start plus its request's ``t``), and
  ``delay_s`` = ``think_time`` (``t`` minus the previous request's ``t`` when absent), both divided
  by ``time_scale``.
- ``hash_id_scope``: "global" ids mean the same block in every file; "local" (the default) ids are
  per file (salted with the trace id, so two traces share nothing by accident); "per_context" ids
  are per session (every subagent its own space).
- Subagents with no kept parent turn before them (listed first, or after turns the length cap
  dropped) become top-level sessions: the contract has no turn to hang them on.
"""

from dataclasses import dataclass, field, replace
from pathlib import Path

from loadtest.workload import Session, Turn, Workload
from loadtest.workloads.replay import TraceTurns, hash_ids_field, int_field, read_json, seconds_field
from loadtest.workloads.scale import TokenScale, check_max_input_tokens, check_time_scale
from loadtest.workloads.tokens import DEFAULT_LOW_ID

WEKA_BLOCK_SIZE = 64
HASH_ID_SCOPES = ("global", "local", "per_context")
REQUEST_TYPES = ("n", "s")


@dataclass
class _Trace:
    """Per-file parse settings."""

    path: Path
    block_size: int
    scope: str
    salt: str  # the trace's salt (global or local scope)


@dataclass
class _Load:
    """Per-load state: turn builder and counts."""

    turns: TraceTurns
    detached: list[Session] = field(default_factory=list)
    subagents: int = 0
    dropped_sessions: int = 0


def _context(
    entries: object, where: str, session_id: str, base_t: float, trace: _Trace, load: _Load
) -> Session | None:
    """The session of one context (the trace's top level or a subagent); None when no turn is kept."""
    if not isinstance(entries, list):
        raise ValueError(f"{trace.path}: {where}: must be a list")
    salt = f"{trace.salt}|{session_id}" if trace.scope == "per_context" else trace.salt
    built: list[tuple[Turn, list[Session]]] = []
    previous_t = 0.0
    spawned = 0
    for index, entry in enumerate(entries):
        at = f"{trace.path}: {where}[{index}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{at}: expected a JSON object, got {type(entry).__name__}")
        kind = entry.get("type", "n")
        if kind == "subagent":
            spawned += 1
            start = base_t + seconds_field(entry, "t", at, default=0.0)
            child_where, child_id = f"{where}[{index}].requests", f"{session_id}/sub-{spawned}"
            child = _context(entry.get("requests"), child_where, child_id, start, trace, load)
            if child is None:
                continue
            load.subagents += 1
            (built[-1][1] if built else load.detached).append(child)
        elif kind in REQUEST_TYPES:
            t = seconds_field(entry, "t", at)
            gap = max(0.0, t - previous_t)
            think = seconds_field(entry, "think_time", at) if "think_time" in entry else gap
            previous_t = t
            turn = load.turns.turn(
                hash_ids_field(entry, at),
                int_field(entry, "in", at),
                int_field(entry, "out", at),
                trace.block_size,
                salt,
                delay_s=think,
                at_s=base_t + t,
            )
            if turn is not None:
                built.append((turn, []))
        else:
            expected = "'n', 's' or 'subagent'"
            raise ValueError(f"{at}: field 'type': unknown request type {kind!r} (expected {expected})")
    if not built:
        load.dropped_sessions += 1
        return None
    return Session(session_id, tuple(replace(turn, subagents=tuple(subs)) for turn, subs in built))


def _renamed(session: Session, suffix: str) -> Session:
    """``session`` and its subagents with ``suffix`` added to their ids."""
    turns = tuple(
        replace(turn, subagents=tuple(_renamed(child, suffix) for child in turn.subagents))
        for turn in session.turns
    )
    return Session(session.session_id + suffix, turns)


def _trace_files(paths: str | Path | list) -> list[Path]:
    """The trace files: one path, a list of paths, or a folder (its ``*.json``, sorted)."""
    items = [paths] if isinstance(paths, str | Path) else list(paths)
    files: list[Path] = []
    for item in items:
        item = Path(item)
        files.extend(sorted(item.glob("*.json")) if item.is_dir() else [item])
    if not files:
        raise ValueError(f"paths: no WEKA trace files in {paths!r}")
    return files


def load_weka(
    paths: str | Path | list,
    scale: int,
    vocab: int,
    *,
    time_scale: float = 1.0,
    max_input_tokens: int | None = None,
    salt: str = "",
    low: int = DEFAULT_LOW_ID,
    copies: int = 1,
) -> Workload:
    """One session per trace file, its requests in order as turns, subagents nested; with ``copies``
    above 1, that many replays of each (``K`` users of the same agent), salted apart.

    Args:
        paths: a ``.json`` trace, a list of them, or a folder of them.
        scale: token divisor (see ``scale.TokenScale``): 64-token blocks become ``max(1, 64 // scale)``.
        vocab, low: ids lie in ``[low, vocab)``.
        time_scale: divide ``t`` and ``think_time`` (2.0 replays twice as fast).
        max_input_tokens: drop turns whose scaled prompt is longer (``meta["dropped_turns"]``); a
            session left with no turn is dropped too (``meta["dropped_sessions"]``).
        salt: mixed into every block's ids (change it to get fresh, uncached prompts).
        copies: replays of every session; copy ``k`` is salted ``f"{salt}copy{k}"`` (its prompts share
            nothing with another copy's) and its sessions are named ``<id>/copy<k>``.

    Returns:
        Sessions named by each file's ``id`` (``trace_0147``), subagents ``trace_0147/sub-<n>``
        (``n`` counts the parent's subagent entries from 1), in order of first arrival.

    Raises:
        ValueError: missing or non-JSON file, a bad field (the message names the file and the
            entry, e.g. ``requests[4].in``), an unknown ``type`` or ``hash_id_scope``, two files with
            one ``id``, bad arguments.
    """
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
        raise ValueError(f"copies: must be a positive integer, got {copies!r}")
    if copies > 1:
        loads = [
            load_weka(paths, scale, vocab, time_scale=time_scale, max_input_tokens=max_input_tokens,
                      salt=f"{salt}copy{k}", low=low)
            for k in range(copies)
        ]  # fmt: skip
        sessions = tuple(
            _renamed(session, f"/copy{k}") for k, one in enumerate(loads) for session in one.sessions
        )
        return replace(loads[0], sessions=sessions, meta=loads[0].meta | {"copies": copies, "salt": salt})
    load = _Load(
        TraceTurns(
            scale=TokenScale(scale),
            vocab=vocab,
            low=low,
            max_input_tokens=check_max_input_tokens(max_input_tokens),
            time_scale=check_time_scale(time_scale),
        )
    )
    sessions: list[Session] = []
    traces: dict[str, str] = {}
    infos = []
    for path in _trace_files(paths):
        data = read_json(path)
        if not isinstance(data, dict) or "requests" not in data:
            raise ValueError(f"{path}: not a WEKA trace: expected a JSON object with 'requests'")
        block_size = int_field(data, "block_size", str(path), default=WEKA_BLOCK_SIZE)
        if block_size < 1:
            raise ValueError(f"{path}: field 'block_size' must be >= 1, got {block_size}")
        trace_id = data.get("id") if isinstance(data.get("id"), str) and data.get("id") else path.stem
        if trace_id in traces:
            raise ValueError(f"{path}: trace id {trace_id!r} is also the id of {traces[trace_id]}")
        traces[trace_id] = str(path)
        scope = data.get("hash_id_scope", "local")
        if scope not in HASH_ID_SCOPES:
            expected = ", ".join(HASH_ID_SCOPES)
            raise ValueError(f"{path}: field 'hash_id_scope': unknown scope {scope!r} (expected {expected})")
        trace_salt = f"{salt}|weka" if scope == "global" else f"{salt}|weka|{trace_id}"
        trace = _Trace(path, block_size, scope, trace_salt)
        session = _context(data["requests"], "requests", trace_id, 0.0, trace, load)
        if session is not None:
            sessions.append(session)
        infos.append({"id": trace_id, "file": str(path), "block_size": block_size, "hash_id_scope": scope})
    sessions.extend(load.detached)
    sessions.sort(key=lambda s: s.turns[0].at_s or 0.0)  # stable: files keep their order at equal times
    meta = {"kind": "trace", "format": "weka", "files": list(traces.values()), "traces": infos, "salt": salt}
    meta |= load.turns.meta()
    meta |= {
        "subagents": load.subagents,
        "detached_subagents": len(load.detached),
        "dropped_sessions": load.dropped_sessions,
    }
    return Workload(
        name="weka:" + ",".join(traces),
        sessions=tuple(sessions),
        description=f"WEKA agentic traces {', '.join(traces)}: tokens / {scale}, times / {time_scale}",
        meta=meta,
    )
