"""The verdict of ``baton mismatch`` and its two renderings: a report for people, an object for tools.

Checks run in order and the first failing one decides: the environment (a field the mode does not
vary differs), the path under test (VACUOUS when the dumps do not show it), then the tokens.
"""

from dataclasses import dataclass

from .compare import Comparison, compare_dumps
from .dump import Dump
from .environment import FieldDiff
from .modes import Mode, check_environments, path_not_run

# status -> process exit code
EXIT_CODES = {"equal": 0, "mismatch": 1, "vacuous": 3, "environment_mismatch": 4}


@dataclass(frozen=True)
class Verdict:
    """What ``baton mismatch`` found. ``comparison`` is None when the environment check failed
    first or the path under test did not run (nothing was compared)."""

    mode: Mode
    files: tuple[str, str]
    environment: tuple[FieldDiff, ...]
    comparison: Comparison | None
    vacuous_reason: str | None
    require_all: bool = False

    @property
    def status(self) -> str:
        if any(not d.allowed for d in self.environment):
            return "environment_mismatch"
        if self.vacuous_reason is not None:
            return "vacuous"
        c = self.comparison
        return "mismatch" if c.mismatched or (self.require_all and c.incomplete) else "equal"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]


def judge(
    mode: Mode,
    a: Dump,
    b: Dump,
    files: tuple[str, str],
    vary: tuple[str, ...] = (),
    require_all: bool = False,
) -> Verdict:
    """Environment first, then the path under test, then the tokens. Requests in one dump only (a
    request alone against it among others) are reported; they fail only with ``require_all``."""
    environment = tuple(check_environments(mode, a, b, vary))
    if any(not d.allowed for d in environment):
        return Verdict(mode, files, environment, None, None)
    reason = path_not_run(mode, a, b)
    if reason is not None:
        return Verdict(mode, files, environment, None, reason)
    comparison = compare_dumps(a, b)
    if comparison.vacuous:
        reason = _why_nothing_compared(comparison)
    return Verdict(mode, files, environment, comparison, reason, require_all)


def to_json(verdict: Verdict) -> dict:
    """The ``--json`` object (standard JSON: no NaN or infinity)."""
    c = verdict.comparison
    return {
        "mode": verdict.mode.name,
        "files": list(verdict.files),
        "status": verdict.status,
        "vacuous": verdict.status == "vacuous",
        "vacuous_reason": verdict.vacuous_reason,
        "environment_diff": {
            d.field: {"a": d.a, "b": d.b, "allowed": d.allowed} for d in verdict.environment
        },
        "compared_tokens": c.compared_tokens if c else 0,
        "bitwise_equal": c.bitwise_equal if c else 0,
        "mismatched": c.mismatched if c else 0,
        "masked_out": c.masked_out if c else 0,
        "max_abs_diff": c.max_abs_diff if c else 0.0,
        "nonfinite_mismatches": c.nonfinite_mismatches if c else 0,
        "first_divergence": {str(k): v for k, v in c.first_divergence.items()} if c else {},
        "divergence_reason": {str(s.request_id): s.reason for s in c.sequences if s.reason} if c else {},
        "missing": {
            "from_a": list(c.missing_from_a) if c else [],
            "from_b": list(c.missing_from_b) if c else [],
        },
        "without_logprobs": list(c.without_logprobs) if c else [],
        "mask": c.mask if c else None,
        "requests_compared": len(c.sequences) if c else 0,
    }


def to_text(verdict: Verdict) -> str:
    """The human report, one fact a line."""
    mode, c = verdict.mode, verdict.comparison
    lines = [f"baton mismatch --mode {mode.name}: A={verdict.files[0]}  B={verdict.files[1]}"]
    lines.append(f"  question: {mode.question}")
    lines.append(f"  A: {mode.a}; B: {mode.b}")
    if not verdict.environment:
        lines.append("environment: identical")
    for d in verdict.environment:
        note = "varied" if d.allowed else "MUST MATCH"
        lines.append(f"environment: {d.field}: {d.a!r} vs {d.b!r} ({note})")
    if c is not None:
        lines.append(f"mask: {_mask_text(c.mask)}; {c.masked_out} positions masked out")
        lines.append(f"requests compared: {len(c.sequences)}")
        lines.append(f"compared tokens: {c.compared_tokens}")
        lines.append(f"bitwise equal: {c.bitwise_equal}")
        lines.append(f"mismatched: {c.mismatched}")
        lines.append(f"max |delta|: {c.max_abs_diff!r}" + _nonfinite(c))
        for s in c.sequences:
            if s.first_divergence is not None:
                lines.append(
                    f"  {s.request_id!r}: first divergence at position {s.first_divergence} ({s.reason}); "
                    f"{s.mismatched} of {s.compared} compared differ, max |delta| {s.max_abs_diff!r}"
                )
        for label, ids in (("missing from A", c.missing_from_a), ("missing from B", c.missing_from_b)):
            if ids:
                lines.append(f"{label}: {', '.join(map(repr, ids))}")
        if c.without_logprobs:
            lines.append(f"without log-probs: {', '.join(map(repr, c.without_logprobs))}")
    lines.append(_verdict_line(verdict))
    return "\n".join(lines)


def _verdict_line(verdict: Verdict) -> str:
    status = verdict.status
    if status == "environment_mismatch":
        fields = ", ".join(d.field for d in verdict.environment if not d.allowed)
        return f"result: ENVIRONMENT MISMATCH ({fields}); no token was compared (--vary FIELD to allow)"
    if status == "vacuous":
        return f"result: VACUOUS ({verdict.vacuous_reason})"
    if status == "mismatch":
        if verdict.comparison.mismatched:
            return "result: MISMATCH"
        return "result: MISMATCH (--require-all: some request was not compared)"
    return "result: BITWISE EQUAL"


def _why_nothing_compared(c: Comparison) -> str:
    if not c.sequences and not c.without_logprobs:
        return "no request id is in both dumps"
    if not c.sequences:
        return "no common request has log-probs on both sides"
    return "every position is masked out"


_MASK_TEXT = {
    "none": "none (every position counts)",
    "A": "A's",
    "B": "B's",
    "A and B": "A's and B's (a position counts when both allow it)",
}


def _mask_text(mask: str) -> str:
    return _MASK_TEXT[mask]


def _nonfinite(c: Comparison) -> str:
    if not c.nonfinite_mismatches:
        return ""
    return f" over finite values; {c.nonfinite_mismatches} non-finite values differ"
