"""``baton`` entry point: parses the subcommand and turns user errors into one clear line, exit 2."""

import argparse
import importlib
import logging
import sys

# command -> the module of this package that registers and runs it, in the order ``baton --help`` lists
COMMANDS = {
    "checkpoint": "checkpoint_command",
    "logits": "logits_command",
    "generate": "generate_command",
    "score": "score_command",
    "capacity": "capacity_command",
    "bench": "bench_command",
    "worker": "worker_command",
    "router": "router_command",
    "serve": "serve_command",
    "cache": "cache_command",
    "client": "client_command",
    "adapters": "adapters_command",
    "loadtest": "loadtest_command",
    "loadtest-compare": "loadtest_compare_command",
    "mismatch": "mismatch_command",
    "train": "train_command",
    "eval": "eval_command",
}


class UsageError(Exception):
    """A user mistake the command reports as ``baton <command>: error: <message>``."""


def build_parser(commands: tuple[str, ...] = tuple(COMMANDS)) -> argparse.ArgumentParser:
    """The ``baton`` parser with ``commands`` (default: all of them; each one imports only its module)."""
    parser = argparse.ArgumentParser(prog="baton", description="Serve hybrid KDA + MLA/DSA + MoE models.")
    parser.add_argument("--log-level", default="WARNING", help="Python logging level (default WARNING)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in commands:
        importlib.import_module(f"{__package__}.{COMMANDS[command]}").register(subparsers)
    return parser


def named_command(argv: list[str]) -> str | None:
    """The command ``argv`` runs when it starts ``[--log-level LEVEL] COMMAND``; None otherwise (help, a
    mistyped command: the parser then needs every command)."""
    if argv[:1] == ["--log-level"]:
        argv = argv[2:]
    elif argv[:1] and argv[0].startswith("--log-level="):
        argv = argv[1:]
    return argv[0] if argv[:1] and argv[0] in COMMANDS else None


def main(argv: list[str] | None = None) -> int:
    """Run one ``baton`` command; returns the process exit status.

    Only the command's module is imported (a worker or a rank does not pay every other command's imports).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    command = named_command(argv)
    parser = build_parser((command,) if command else tuple(COMMANDS))
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
