"""The checkpoint a cluster benchmark serves: ``--model DIR``, or a random ``--family`` / ``--preset``
one made in a scratch folder for the run (``bench pd``, ``router-latency``, ``trust``)."""

import argparse
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from services.engine.checkpoint.init_folder import init_checkpoint

FAMILIES = ("k3", "kimi_linear", "deepseek_v32")


def add_model_flags(bench: argparse.ArgumentParser) -> None:
    """``--model``, ``--family`` and ``--preset``."""
    bench.add_argument(
        "--model", type=Path, help="checkpoint folder (default: a random --family/--preset one)"
    )
    bench.add_argument("--family", default="k3", choices=FAMILIES)
    bench.add_argument("--preset", default="tiny", help="random checkpoint size when --model is not given")


@contextmanager
def bench_model(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """The checkpoint folder to serve and its name in a report (the folder, or ``random FAMILY
    (PRESET)``); a random one lives until the block ends."""
    if args.model is not None:
        yield str(args.model), str(args.model)
        return
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch) / f"{args.family}-{args.preset}"
        init_checkpoint(folder, args.family, args.preset, seed=0)
        yield str(folder), f"random {args.family} ({args.preset})"
