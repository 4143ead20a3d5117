"""``baton`` entry point: parses the subcommand and turns user errors into one clear line, exit 2."""

import argparse
import logging
import sys

from . import (
    adapters_command,
    bench_command,
    cache_command,
    capacity_command,
    checkpoint_command,
    client_command,
    eval_command,
    generate_command,
    loadtest_command,
    loadtest_compare_command,
    logits_command,
    mismatch_command,
    router_command,
    score_command,
    serve_command,
    train_command,
    worker_command,
)

SUBCOMMANDS = (
    checkpoint_command,
    logits_command,
    generate_command,
    score_command,
    capacity_command,
    bench_command,
    worker_command,
    router_command,
    serve_command,
    cache_command,
    client_command,
    adapters_command,
    loadtest_command,
    loadtest_compare_command,
    mismatch_command,
    train_command,
    eval_command,
)


class UsageError(Exception):
    """A user mistake the command reports as ``baton <command>: error: <message>``."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="baton", description="Serve hybrid KDA + MLA/DSA + MoE models.")
    parser.add_argument("--log-level", default="WARNING", help="Python logging level (default WARNING)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one ``baton`` command; returns the process exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.run(args) or 0
    except (ValueError, FileNotFoundError) as error:
        # Config, checkpoint, tokenizer and argument errors all name what to fix.
        print(f"baton {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
