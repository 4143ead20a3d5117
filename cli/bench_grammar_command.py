"""``baton bench grammar``: structured output's cost per request (compile) and per token (one step's
bitmask) for xgrammar and llguidance, at the demo vocabulary and a large one
(``services/engine/benchmark/grammar_bench.py``)."""

import argparse
from pathlib import Path

from services.engine.benchmark.grammar_bench import (
    build_big_tokenizer,
    costs_json,
    default_big_tokenizer_dir,
    format_costs,
    run_grammar_bench,
)


def register_grammar(kinds: argparse._SubParsersAction) -> None:
    """Add ``grammar`` to the ``bench`` subcommands."""
    bench = kinds.add_parser(
        "grammar", help="structured output: schema compile time and per-step token-mask time per library"
    )
    bench.add_argument(
        "--tokenizer",
        type=Path,
        action="append",
        help="tokenizer folder (repeatable; default: models/k3-demo)",
    )
    bench.add_argument(
        "--big-vocab",
        type=int,
        default=163_840,
        help="also a byte-level BPE of this many ids, built once in a temp folder (0: skip; default 163840)",
    )
    bench.add_argument(
        "--libraries", default="xgrammar,llguidance", help="comma-separated (default xgrammar,llguidance)"
    )
    bench.add_argument("--compiles", type=int, default=5, help="fresh compiles timed per grammar (default 5)")
    bench.add_argument("--json", action="store_true", help="print JSON instead of the table")
    bench.set_defaults(run=run_grammar)


def run_grammar(args: argparse.Namespace) -> int:
    dirs = list(args.tokenizer or [Path("models/k3-demo")])
    if args.big_vocab:
        dirs.append(build_big_tokenizer(default_big_tokenizer_dir(args.big_vocab), args.big_vocab))
    libraries = tuple(name for name in args.libraries.split(",") if name)
    costs = run_grammar_bench(dirs, libraries, compiles=args.compiles)
    print(costs_json(costs) if args.json else format_costs(costs))
    return 0
