"""Log-prob dumps and their bitwise comparison (``baton mismatch``); torch-free, so the trainer, the
CLI and any machine without the engine can read and write them. See ``dump.py`` for the format."""

from .compare import Comparison, SequenceDiff, compare_dumps
from .dump import PATHS, Dump, DumpError, LogprobRecord, read_dump, write_dump
from .environment import Environment, FieldDiff, collect_environment, cpu_name, diff_environments
from .modes import MODES, Mode
from .report import EXIT_CODES, Verdict, judge

__all__ = [
    "EXIT_CODES",
    "MODES",
    "PATHS",
    "Comparison",
    "Dump",
    "DumpError",
    "Environment",
    "FieldDiff",
    "LogprobRecord",
    "Mode",
    "SequenceDiff",
    "Verdict",
    "collect_environment",
    "compare_dumps",
    "cpu_name",
    "diff_environments",
    "judge",
    "read_dump",
    "write_dump",
]
