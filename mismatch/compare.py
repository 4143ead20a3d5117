"""Bitwise comparison of two dumps, request by request and position by position.

Per request present in both (positions are indices into ``token_ids``)::

    position   0    1    2    3    4
    tokens A   5    9    7    2    8
    tokens B   5    9    7    3    1      <- tokens differ at 3: a divergence ("token"); 4 on
    mask       1    0    1    .    .         are skipped (the contexts differ)
    compared   x         x    x
    bits A/B   =         !=             <- position 2: the first divergence ("logprob")

A position counts when both dumps' masks allow it (a missing mask allows all). Two values are equal
when their dtypes are the same and their bit patterns are the same (so +0.0 and -0.0 differ, two NaNs
differ by payload, and equal floats of different dtypes differ). A token, prompt or length
difference is one compared, mismatched position where it starts. ``max_abs_diff`` is over compared
positions whose two values are both finite; differing non-finite ones are counted apart.
"""

import math
from dataclasses import dataclass

from .dump import Dump, LogprobRecord


@dataclass(frozen=True)
class SequenceDiff:
    """One request's comparison. ``reason`` of the first divergence: ``logprob``, ``dtype``,
    ``token``, ``length`` or ``prompt``; None when it has none."""

    request_id: str | int
    compared: int
    equal: int
    masked_out: int
    skipped: int
    first_divergence: int | None
    reason: str | None
    max_abs_diff: float
    nonfinite_mismatches: int

    @property
    def mismatched(self) -> int:
        return self.compared - self.equal


@dataclass(frozen=True)
class Comparison:
    """Two dumps compared. ``missing_from_a``: ids B has and A lacks (and the reverse);
    ``without_logprobs``: ids in both where a side recorded no log-probs (not compared)."""

    sequences: tuple[SequenceDiff, ...]
    missing_from_a: tuple
    missing_from_b: tuple
    without_logprobs: tuple
    mask: str

    @property
    def compared_tokens(self) -> int:
        return sum(s.compared for s in self.sequences)

    @property
    def bitwise_equal(self) -> int:
        return sum(s.equal for s in self.sequences)

    @property
    def mismatched(self) -> int:
        return sum(s.mismatched for s in self.sequences)

    @property
    def masked_out(self) -> int:
        return sum(s.masked_out for s in self.sequences)

    @property
    def max_abs_diff(self) -> float:
        return max((s.max_abs_diff for s in self.sequences), default=0.0)

    @property
    def nonfinite_mismatches(self) -> int:
        return sum(s.nonfinite_mismatches for s in self.sequences)

    @property
    def first_divergence(self) -> dict:
        return {s.request_id: s.first_divergence for s in self.sequences if s.first_divergence is not None}

    @property
    def vacuous(self) -> bool:
        """Nothing was compared: no common request, no log-probs, or every position masked out."""
        return self.compared_tokens == 0

    @property
    def incomplete(self) -> bool:
        """Some request is not compared: in one dump only, or without log-probs on a side."""
        return bool(self.missing_from_a or self.missing_from_b or self.without_logprobs)


def compare_dumps(a: Dump, b: Dump) -> Comparison:
    """Compare every request of ``a`` and ``b`` by id, in ``a``'s order (the environments are the
    caller's business: ``modes.check_environments`` first)."""
    records_a, records_b = a.by_id(), b.by_id()
    sequences, without = [], []
    for request_id, left in records_a.items():
        right = records_b.get(request_id)
        if right is None:
            continue
        if left.logprob_bits is None or right.logprob_bits is None:
            without.append(request_id)
            continue
        sequences.append(compare_records(left, right))
    return Comparison(
        sequences=tuple(sequences),
        missing_from_a=tuple(i for i in records_b if i not in records_a),
        missing_from_b=tuple(i for i in records_a if i not in records_b),
        without_logprobs=tuple(without),
        mask=_mask_name(a, b),
    )


def compare_records(a: LogprobRecord, b: LogprobRecord) -> SequenceDiff:
    """One request, both sides with log-probs (see the module docstring)."""
    compared = equal = masked_out = nonfinite = 0
    first, reason, worst = None, None, 0.0
    values_a, values_b = a.logprobs, b.logprobs
    length = max(len(a.token_ids), len(b.token_ids))
    if a.prompt_ids is not None and b.prompt_ids is not None and a.prompt_ids != b.prompt_ids:
        return SequenceDiff(a.request_id, 1, 0, 0, length, 0, "prompt", 0.0, 0)
    common = min(len(a.token_ids), len(b.token_ids))
    for p in range(length):
        if p >= common or a.token_ids[p] != b.token_ids[p]:  # the contexts part here: stop
            kind = "token" if p < common else "length"
            at = p if first is None else first
            skipped = length - p - 1
            return SequenceDiff(
                a.request_id, compared + 1, equal, masked_out, skipped, at, reason or kind, worst, nonfinite
            )
        if (a.mask is not None and not a.mask[p]) or (b.mask is not None and not b.mask[p]):
            masked_out += 1
            continue
        compared += 1
        if a.dtype == b.dtype and a.logprob_bits[p] == b.logprob_bits[p]:
            equal += 1
            continue
        if first is None:
            first, reason = p, "logprob" if a.dtype == b.dtype else "dtype"
        delta = abs(values_a[p] - values_b[p])
        if math.isfinite(values_a[p]) and math.isfinite(values_b[p]):
            worst = max(worst, delta)
        else:
            nonfinite += 1
    return SequenceDiff(a.request_id, compared, equal, masked_out, 0, first, reason, worst, nonfinite)


def _mask_name(a: Dump, b: Dump) -> str:
    """Which dumps' masks chose the positions: ``none``, ``A``, ``B`` or ``A and B``."""
    has_a = any(r.mask is not None for r in a.records)
    has_b = any(r.mask is not None for r in b.records)
    return {(False, False): "none", (True, False): "A", (False, True): "B", (True, True): "A and B"}[
        (has_a, has_b)
    ]
