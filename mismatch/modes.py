"""The experiment groups ``baton mismatch`` runs: what each pair of dumps must be, and which
environment fields may differ between them.

    mode        A                                B                     varies        must be
    general     any dump                         any dump              nothing       -
    inference   the engine (generate or score)   the engine            flags         batch_invariant
    training    the trainer                      the trainer           flags         batch_invariant
    rollout     the engine, generating           the trainer           flags,        batch_invariant
                                                                       kv_format
    scorer      the engine, scoring given tokens the engine, generating flags        batch_invariant

(rollout and scorer accept A and B either way round.) ``--vary FIELD`` allows more (``device``,
``libraries.torch``, ``numerics`` to measure the default path). A dump whose numerics or path is not
the one the mode tests means the path under test did not run: the result is VACUOUS, not a pass.
"""

from dataclasses import dataclass

from .dump import Dump
from .environment import FieldDiff, diff_environments

SERVING = frozenset({"generate", "score"})


@dataclass(frozen=True)
class Mode:
    """One experiment group.

    Attributes:
        name: the ``--mode`` value.
        question: what a pass shows.
        a, b: what each dump must be (for the help and the report).
        paths: the producing paths the pair must have, ``(for one dump, for the other)``; either
            order when ``either_order``; None: any.
        batch_invariant: both dumps must come from ``batch_invariant`` numerics.
        may_differ: environment fields (dotted prefixes) the experiment varies.
    """

    name: str
    question: str
    a: str
    b: str
    paths: tuple[frozenset, frozenset] | None
    either_order: bool
    batch_invariant: bool
    may_differ: tuple[str, ...]


MODES = {
    mode.name: mode
    for mode in (
        Mode(
            "general",
            "do the two dumps hold the same bits?",
            "any dump",
            "any dump",
            None,
            False,
            False,
            (),
        ),
        Mode(
            "inference",
            "does the engine give a request the same bits whatever the batch, chunking or TP degree?",
            "the engine (generate or score), one setting",
            "the engine, the same requests under another batch composition or engine flags",
            (SERVING, SERVING),
            False,
            True,
            ("flags",),
        ),
        Mode(
            "training",
            "does the trainer's forward give a sequence the same bits whatever its micro-batch or packing?",
            "the trainer's forward",
            "the trainer's forward under other trainer flags or batch composition",
            (frozenset({"trainer"}), frozenset({"trainer"})),
            False,
            True,
            ("flags",),
        ),
        Mode(
            "rollout",
            "does the trainer reproduce the served log-probs bit for bit (zero-mismatch RL)?",
            "the served rollout (generate)",
            "the trainer's forward over the same tokens",
            (frozenset({"generate"}), frozenset({"trainer"})),
            True,
            True,
            ("flags", "kv_format"),
        ),
        Mode(
            "scorer",
            "does scoring given tokens in one forward match the log-probs generation reported?",
            "the engine scoring the generated tokens (score)",
            "the engine generating them (generate)",
            (frozenset({"score"}), frozenset({"generate"})),
            True,
            True,
            ("flags",),
        ),
    )
}


def check_environments(mode: Mode, a: Dump, b: Dump, vary: tuple[str, ...] = ()) -> list[FieldDiff]:
    """Every differing environment field, each marked allowed or not by the mode and ``vary``."""
    return diff_environments(a.environment, b.environment, mode.may_differ + tuple(vary))


def path_not_run(mode: Mode, a: Dump, b: Dump) -> str | None:
    """Why the dumps do not show the path ``mode`` tests (the VACUOUS reason), or None."""
    if mode.batch_invariant:
        for label, dump in (("A", a), ("B", b)):
            if dump.environment.numerics != "batch_invariant":
                numerics = dump.environment.numerics
                return f"dump {label} ran {numerics} numerics; {mode.name} tests batch_invariant"
    if mode.paths is None:
        return None
    paths_a = {r.path for r in a.records}
    paths_b = {r.path for r in b.records}
    first, second = mode.paths
    if paths_a <= first and paths_b <= second:
        return None
    if mode.either_order and paths_a <= second and paths_b <= first:
        return None
    want = f"A from {_names(first)}, B from {_names(second)}"
    if mode.either_order:
        want += " (or the reverse)"
    return f"{mode.name} compares {want}; A has {_names(paths_a)}, B has {_names(paths_b)}"


def _names(paths) -> str:
    return "/".join(sorted(paths)) or "no records"
