"""``baton mismatch A.jsonl B.jsonl [--mode MODE] [--json]``: compare two log-prob dumps bitwise.

The dumps are ``baton generate --out`` files or the trainer's (``mismatch/dump.py``). The environment
fingerprints are compared first, then whether the dumps show the path the mode tests, then every
common request position by position. Requests in one dump only are listed (they fail only with
``--require-all``). Exit 0: something was compared and nothing differs; 1: values or tokens differ;
3: VACUOUS (nothing compared, or the path under test did not run); 4: the environments differ in a
field the mode does not vary; 2: bad input.
"""

import argparse
import json
from pathlib import Path

from mismatch import MODES, judge, read_dump
from mismatch.report import to_json, to_text


def register(commands: argparse._SubParsersAction) -> None:
    modes = " | ".join(
        f"{m.name}: A = {m.a}; B = {m.b}; may differ: {', '.join(m.may_differ) or 'nothing'}"
        + ("; needs batch_invariant" if m.batch_invariant else "")
        for m in MODES.values()
    )
    parser = commands.add_parser(
        "mismatch",
        help="compare two log-prob dumps bitwise (served vs trainer, two servers, ...)",
        description=__doc__.split("\n\n", 1)[1],
        epilog=f"modes -- {modes}",
    )
    parser.add_argument("a", type=Path, metavar="A.jsonl", help="a log-prob dump (baton generate --out)")
    parser.add_argument("b", type=Path, metavar="B.jsonl", help="the dump to compare it with")
    parser.add_argument(
        "--mode",
        choices=list(MODES),
        default="general",
        help="the experiment group: what A and B must be and which environment fields may differ "
        "(default general: any two dumps, every field must match)",
    )
    parser.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="FIELD",
        help="an environment field that may differ too (dotted: flags.max_num_seqs, libraries.torch; "
        "a prefix allows all under it); repeatable",
    )
    parser.add_argument(
        "--require-all",
        action="store_true",
        help="fail when a request id is in one dump only or lacks log-probs (default: reported only)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    a, b = read_dump(args.a), read_dump(args.b)  # DumpError (a ValueError): file, line and field
    verdict = judge(MODES[args.mode], a, b, (str(args.a), str(args.b)), tuple(args.vary), args.require_all)
    print(json.dumps(to_json(verdict), indent=2) if args.json else to_text(verdict))
    return verdict.exit_code
