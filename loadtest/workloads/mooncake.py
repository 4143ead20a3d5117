"""Replay of Mooncake traces (kvcache-ai/Mooncake, FAST'25): one JSON request a line, fixed schedule.

A line is ``{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}`` with one
hash id per 512-token block, the last block partial (``len(hash_ids) == ceil(n / 512)``); equal ids
in different lines mean the same prefix blocks. Ids are global to the file.
"""

import json
from pathlib import Path

from loadtest.workload import Session, Workload
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
) -> Workload:
    """One one-turn session per trace line, arriving at the line's timestamp.

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

    Returns:
        Sessions ``mooncake-<i>`` (``i`` the request's index in the file), each one turn with
        ``at_s = timestamp / 1000 / time_scale``.

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
    sessions = []
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
            turn = turns.turn(
                hash_ids_field(record, where),
                int_field(record, "input_length", where),
                int_field(record, "output_length", where),
                MOONCAKE_BLOCK_SIZE,
                salt,
                at_s=seconds_field(record, "timestamp", where) / 1000.0,
            )
            if turn is not None:
                sessions.append(Session(f"mooncake-{read}", (turn,)))
            read += 1
    meta = {"kind": "trace", "format": "mooncake", "files": [str(path)], "salt": salt, "requests": read}
    meta |= turns.meta()
    meta["block_size"] = MOONCAKE_BLOCK_SIZE
    meta["scaled_block_size"] = turns.scale.block_size(MOONCAKE_BLOCK_SIZE)
    meta["dropped_sessions"] = turns.dropped_turns  # one turn a session
    return Workload(
        name=f"mooncake:{path.stem}",
        sessions=tuple(sessions),
        description=f"Mooncake trace {path.name}: {len(sessions)} requests, tokens / {scale}",
        meta=meta,
    )
