"""Replay of Mooncake traces (kvcache-ai/Mooncake, FAST'25): one JSON request a line, fixed schedule.

A line is ``{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}`` with one
hash id per 512-token block, the last block partial (``len(hash_ids) == ceil(n / 512)``); equal ids
in different lines mean the same prefix blocks. Ids are global to the file.

In the conversation trace every line starts with the same system block (id 0), and the later turns of
a conversation repeat its earlier turns' ids: lines whose first two ids are equal are one conversation
(``conversations=True`` groups them into one session).
"""

import json
from pathlib import Path

from loadtest.workload import Session, Turn, Workload
from loadtest.workloads.replay import TraceTurns, hash_ids_field, int_field, seconds_field
from loadtest.workloads.scale import TokenScale, check_max_input_tokens, check_time_scale
from loadtest.workloads.tokens import DEFAULT_LOW_ID

MOONCAKE_BLOCK_SIZE = 512


def load_mooncake(
    path: str | Path,
    scale: int,
    vocab: int,
    max_requests: int | None = None,
    max_input_tokens: int | None = None,
    salt: str | None = None,
    *,
    time_scale: float = 1.0,
    low: int = DEFAULT_LOW_ID,
    conversations: bool = False,
) -> Workload:
    """One one-turn session per trace line, arriving at the line's timestamp (or one per conversation).

    Args:
        path: the ``.jsonl`` trace.
        scale: token divisor (see ``scale.TokenScale``): 512-token blocks become ``max(1, 512 // scale)``.
        vocab, low: ids lie in ``[low, vocab)``.
        max_requests: read only the first this many requests (lines); None reads all.
        max_input_tokens: drop requests whose scaled prompt is longer (counted in
            ``meta["dropped_turns"]``).
        salt: keeps this trace's blocks apart from other traces' (default: the file name, so two
            Mooncake files whose ids both start at 0 share nothing).
        time_scale: divide arrival times (2.0 replays twice as fast).
        conversations: group the lines whose first two hash ids are equal (the shared system block and
            the conversation's own first block) into one session, its turns in file order.

    Returns:
        Sessions ``mooncake-<i>`` (``i`` the index in the file of the request, or of the conversation's
        first kept request), each turn with ``at_s = timestamp / 1000 / time_scale``, in order of ``i``.

    Raises:
        ValueError: missing file, a line that is not JSON or lacks a valid field (the message names
            the file, line and field), bad arguments.
    """
    path = Path(path)
    turns = TraceTurns(
        scale=TokenScale(scale),
        vocab=vocab,
        low=low,
        max_input_tokens=check_max_input_tokens(max_input_tokens),
        time_scale=check_time_scale(time_scale),
    )
    if max_requests is not None and (not isinstance(max_requests, int) or max_requests < 1):
        raise ValueError(f"max_requests: must be an integer >= 1 or None, got {max_requests!r}")
    salt = f"mooncake:{path.name}" if salt is None else salt
    sessions: dict[tuple[int, ...], tuple[int, list[Turn]]] = {}  # key -> (first line's index, turns)
    seen: set[tuple[int, ...]] = set()  # every session's key, kept or not (all its turns dropped)
    read = 0
    try:
        lines = path.open()
    except OSError as error:
        raise ValueError(f"{path}: cannot read trace: {error.strerror or error}") from error
    with lines:
        for line_no, line in enumerate(lines, start=1):
            if max_requests is not None and read >= max_requests:
                break
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not JSON: {error}") from error
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
            hash_ids = hash_ids_field(record, where)
            turn = turns.turn(
                hash_ids,
                int_field(record, "input_length", where),
                int_field(record, "output_length", where),
                MOONCAKE_BLOCK_SIZE,
                salt,
                at_s=seconds_field(record, "timestamp", where) / 1000.0,
            )
            key = tuple(hash_ids[:2]) if conversations else (read,)
            seen.add(key)
            if turn is not None:
                sessions.setdefault(key, (read, []))[1].append(turn)
            read += 1
    meta = {"kind": "trace", "format": "mooncake", "files": [str(path)], "salt": salt, "requests": read}
    meta |= turns.meta()
    meta["block_size"] = MOONCAKE_BLOCK_SIZE
    meta["scaled_block_size"] = turns.scale.block_size(MOONCAKE_BLOCK_SIZE)
    meta["dropped_sessions"] = len(seen) - len(sessions)
    meta["conversations"] = conversations
    unit = "conversations" if conversations else "requests"
    return Workload(
        name=f"mooncake:{path.stem}",
        sessions=tuple(Session(f"mooncake-{first}", tuple(kept)) for first, kept in sessions.values()),
        description=f"Mooncake trace {path.name}: {len(sessions)} {unit}, tokens / {scale}",
        meta=meta,
    )
