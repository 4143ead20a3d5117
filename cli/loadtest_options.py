"""``baton loadtest``'s workload flags: which builder option each feeds, per ``--workload``, with
the defaults the command uses (the builders have none for most)."""

import argparse

from loadtest.workload import Workload
from loadtest.workloads import build_workload

DEFAULT_VOCAB = 1000  # the API does not report the model's vocabulary; ids lie in [16, --vocab)

# dest -> (flag, type, metavar, help)
FLAGS = {
    "trace": ("--trace", str, "FILE", "trace file (Mooncake .jsonl or WEKA .json) or WEKA folder"),
    "scale": ("--scale", int, "K", "divide trace token counts by K, keeping its blocks (default 1)"),
    "max_input_tokens": ("--max-input-tokens", int, "N", "drop trace turns with longer prompts"),
    "salt": ("--salt", str, "TEXT", "mixed into trace prompts: a new salt gives uncached prompts"),
    "copies": (
        "--copies",
        int,
        "K",
        "WEKA traces: K replays of each agent session, salted apart (K users of one agent; default 1)",
    ),
    "sessions": ("--sessions", int, "N", "sessions to generate (synthetic 100, multiturn and tool_agent 8)"),
    "input_len": (
        "--input-len",
        int,
        "N",
        "prompt length; shared_prefix: own suffix; multiturn: first; tool_agent: the task",
    ),
    "output_len": ("--output-len", int, "N", "tokens to generate per request (default 32)"),
    "range_ratio": ("--range-ratio", float, "R", "synthetic lengths uniform in len*(1±R) (default 0)"),
    "turns": ("--turns", int, "N", "multiturn, tool_agent: turns per session (default 4)"),
    "turn_len": ("--turn-len", int, "N", "multiturn: ids added per later turn (default 64)"),
    "think_time": ("--think-time", float, "S", "multiturn: delay after a user message (default 1)"),
    "tool_every": ("--tool-every", int, "N", "multiturn: every Nth turn answers a tool call (default 2)"),
    "tool_time": ("--tool-time", float, "S", "multiturn, tool_agent: delay of a tool call (default 0.5)"),
    "subagent_every": ("--subagent-every", int, "N", "multiturn: spawn subagents every N turns (0 never)"),
    "subagent_turns": ("--subagent-turns", int, "N", "multiturn: turns per subagent (default 2)"),
    "subagent_fanout": ("--subagent-fanout", int, "N", "multiturn: subagents spawned together (default 1)"),
    "tokenizer": ("--tokenizer", str, "DIR", "tool_agent: the served model's folder (its chat template)"),
    "result_median": ("--result-median", int, "N", "tool_agent: median tool-result tokens (default 600)"),
    "result_sigma": ("--result-sigma", float, "S", "tool_agent: spread of log(result tokens) (default 1)"),
    "result_max": ("--result-max", int, "N", "tool_agent: largest tool result in tokens (default 8192)"),
    "groups": ("--groups", int, "N", "shared_prefix: prefix groups (default 4)"),
    "prompts_per_group": ("--prompts-per-group", int, "N", "shared_prefix: prompts per group (default 8)"),
    "prefix_len": ("--prefix-len", int, "N", "shared_prefix: shared prefix length (default 256)"),
}

# --workload -> dest -> (builder option, default; None: the builder's own default, or required)
OPTIONS = {
    "synthetic": {
        "sessions": ("num_requests", 100),
        "input_len": ("input_len", 256),
        "output_len": ("output_len", 32),
        "range_ratio": ("range_ratio", 0.0),
    },
    "shared_prefix": {
        "groups": ("num_groups", 4),
        "prompts_per_group": ("prompts_per_group", 8),
        "prefix_len": ("prefix_len", 256),
        "input_len": ("suffix_len", 64),
        "output_len": ("output_len", 32),
    },
    "multiturn": {
        "sessions": ("num_sessions", 8),
        "turns": ("turns", 4),
        "input_len": ("first_len", 256),
        "turn_len": ("turn_len", 64),
        "output_len": ("output_len", 32),
        "think_time": ("think_time_s", 1.0),
        "tool_every": ("tool_call_every", 2),
        "tool_time": ("tool_time_s", 0.5),
        "subagent_every": ("subagent_every", 0),
        "subagent_turns": ("subagent_turns", 2),
        "subagent_fanout": ("subagent_fanout", 1),
    },
    "tool_agent": {
        "tokenizer": ("tokenizer", None),
        "sessions": ("num_sessions", 8),
        "turns": ("turns", 4),
        "input_len": ("task_len", 128),
        "output_len": ("output_len", 32),
        "tool_time": ("tool_time_s", 0.5),
        "result_median": ("result_median", 600),
        "result_sigma": ("result_sigma", 1.0),
        "result_max": ("result_max", 8192),
    },
    "trace": {
        "trace": ("path", None),
        "scale": ("scale", 1),
        "max_input_tokens": ("max_input_tokens", None),
        "salt": ("salt", None),
        "copies": ("copies", 1),
    },
}
SEEDED = ("synthetic", "shared_prefix", "multiturn", "tool_agent")


def add_workload_flags(parser: argparse.ArgumentParser) -> None:
    """``--workload``, ``--vocab``, ``--seed`` and every builder flag (each names its workloads)."""
    group = parser.add_argument_group("workload")
    group.add_argument("--workload", required=True, choices=tuple(OPTIONS), help="what to send")
    group.add_argument(
        "--vocab",
        type=int,
        default=DEFAULT_VOCAB,
        metavar="N",
        help=f"prompt ids lie in [16, N) (default {DEFAULT_VOCAB}: the API does not report the vocabulary)",
    )
    group.add_argument("--seed", type=int, default=0, help="workload and arrival seed (default 0)")
    for dest, (flag, kind, metavar, text) in FLAGS.items():
        group.add_argument(flag, dest=dest, type=kind, default=None, metavar=metavar, help=text)


def workload_from_args(args: argparse.Namespace) -> Workload:
    """Build the workload; ValueError naming the flag for a flag of another workload, a missing
    ``--trace`` or a value the builder refuses."""
    kind = args.workload
    accepted = OPTIONS[kind]
    for dest, (flag, *_rest) in FLAGS.items():
        if getattr(args, dest) is not None and dest not in accepted:
            raise ValueError(f"{flag}: not an option of --workload {kind}")
    if kind == "trace" and args.trace is None:
        raise ValueError("--trace: required by --workload trace")
    if kind == "tool_agent" and args.tokenizer is None:
        raise ValueError("--tokenizer: required by --workload tool_agent (the served model's folder)")
    options: dict = {"vocab": args.vocab}
    if kind in SEEDED:
        options["seed"] = args.seed
    flag_of = {"vocab": "--vocab", "seed": "--seed"}
    for dest, (option, default) in accepted.items():
        value = getattr(args, dest)
        value = default if value is None else value
        flag_of[option] = FLAGS[dest][0]
        if value is not None:
            options[option] = value
    try:
        return build_workload(kind, **options)
    except ValueError as error:
        message = str(error)
        for option, flag in flag_of.items():
            if message.startswith(f"{option}:"):
                message = flag + message[len(option) :]
                break
        raise ValueError(message) from None
