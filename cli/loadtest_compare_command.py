"""``baton loadtest-compare``: side-by-side report of finished load tests (one frontier plot)."""

import argparse
import json
from pathlib import Path

from loadtest.report import compare_report


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "loadtest-compare", help="compare finished load tests: one frontier plot and page for all"
    )
    parser.add_argument(
        "runs", nargs="+", metavar="LABEL=DIR", help="a label and the --out folder of a baton loadtest run"
    )
    parser.add_argument("--out", required=True, type=Path, help="comparison folder (created if missing)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    summaries = {}
    for run_spec in args.runs:
        label, _, folder = run_spec.partition("=")
        if not label or not folder:
            raise ValueError(f"LABEL=DIR: expected a label and a folder, got {run_spec!r}")
        if label in summaries:
            raise ValueError(f"LABEL=DIR: label {label!r} is given twice")
        path = Path(folder) / "summary.json"
        try:
            summaries[label] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"LABEL=DIR: cannot read {path} ({error})") from None
    written = compare_report(args.out, summaries)
    print(f"comparison written: {written['index']} (frontier: {written['frontier']})")
    return 0
