"""``--max-n`` of ``baton router`` and ``baton serve``: the largest ``n`` (samples per prompt) the
OpenAI front accepts; each sample is its own generation (``router/openai/fanout.py``)."""

import argparse

from router.openai.schema import DEFAULT_MAX_N


def add_max_n_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-n",
        type=int,
        default=DEFAULT_MAX_N,
        metavar="N",
        help=f"OpenAI front: the largest n, samples per prompt (default {DEFAULT_MAX_N})",
    )


def checked_max_n(args: argparse.Namespace) -> int:
    """``--max-n``, at least 1.

    Raises:
        ValueError: below 1, naming the flag.
    """
    if args.max_n < 1:
        raise ValueError(f"--max-n: must be >= 1, got {args.max_n}")
    return args.max_n
