"""What the trace loaders share: field readers whose errors name the place, and scaled trace turns.

Errors read ``<file>:<line>: field 'input_length': ...`` (Mooncake) or
``<file>: requests[4].requests[2].in: ...`` (WEKA), so a bad trace is fixed without a debugger.
"""

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from loadtest.workload import Turn
from loadtest.workloads.scale import TokenScale
from loadtest.workloads.tokens import prompt_from_hash_ids

_MISSING = object()


def read_json(path: Path) -> object:
    """The parsed JSON of a whole file; ValueError naming the file when it is missing or not JSON."""
    try:
        text = path.read_text()
    except OSError as error:
        raise ValueError(f"{path}: cannot read trace: {error.strerror or error}") from error
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not JSON: {error}") from error


def int_field(record: dict, name: str, where: str, default: object = _MISSING) -> int:
    """``record[name]`` as an integer >= 0 (``default`` when absent, if given)."""
    value = record.get(name, default)
    if value is _MISSING:
        raise ValueError(f"{where}: missing field {name!r}")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: field {name!r} must be an integer >= 0, got {value!r}")
    return value


def seconds_field(record: dict, name: str, where: str, default: object = _MISSING) -> float:
    """``record[name]`` as a finite number >= 0 (``default`` when absent, if given)."""
    value = record.get(name, default)
    if value is _MISSING:
        raise ValueError(f"{where}: missing field {name!r}")
    valid = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not valid or value < 0:
        raise ValueError(f"{where}: field {name!r} must be a number >= 0, got {value!r}")
    return float(value)


def hash_ids_field(record: dict, where: str) -> list[int]:
    """``record["hash_ids"]``: a list of integers."""
    value = record.get("hash_ids", _MISSING)
    if value is _MISSING:
        raise ValueError(f"{where}: missing field 'hash_ids'")
    if not isinstance(value, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in value):
        raise ValueError(f"{where}: field 'hash_ids' must be a list of integers")
    return value


@dataclass
class TraceTurns:
    """Builds the scaled turns of one load and counts the requests the length cap dropped.

    ``max_input_tokens`` is applied to the scaled prompt: a longer request is dropped, not
    truncated (a cut prompt would no longer share the trace's blocks), and counted in
    ``dropped_turns``.
    """

    scale: TokenScale
    vocab: int
    low: int
    max_input_tokens: int | None
    time_scale: float
    dropped_turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    _blocks: dict = field(default_factory=dict, repr=False)  # shared blocks, built once per load

    def turn(
        self,
        hash_ids: Sequence[int],
        input_length: int,
        output_length: int,
        block_size: int,
        salt: str,
        *,
        delay_s: float = 0.0,
        at_s: float | None = None,
    ) -> Turn | None:
        """The scaled turn of one trace request, or None when it exceeds ``max_input_tokens``.

        ``delay_s`` and ``at_s`` are trace seconds; they are divided by ``time_scale`` here.
        """
        length = self.scale.input_length(input_length, len(hash_ids), block_size)
        if self.max_input_tokens is not None and length > self.max_input_tokens:
            self.dropped_turns += 1
            return None
        size = self.scale.block_size(block_size)
        prompt = prompt_from_hash_ids(hash_ids, size, length, self.vocab, salt, self.low, self._blocks)
        max_tokens = self.scale.output_length(output_length)
        self.input_tokens += length
        self.output_tokens += max_tokens
        return Turn(
            prompt_ids=prompt,
            max_tokens=max_tokens,
            delay_s=delay_s / self.time_scale,
            at_s=None if at_s is None else at_s / self.time_scale,
        )

    def meta(self) -> dict:
        """The counts a workload's ``meta`` reports (scaled tokens of the kept turns)."""
        return {
            "scale": self.scale.factor,
            "time_scale": self.time_scale,
            "max_input_tokens": self.max_input_tokens,
            "over_length": "drop",
            "dropped_turns": self.dropped_turns,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "vocab": self.vocab,
            "low": self.low,
        }
