"""``baton checkpoint init``: write a random checkpoint folder with a tokenizer."""

import argparse
from pathlib import Path

from services.engine.checkpoint.init_folder import init_checkpoint
from services.engine.checkpoint.presets import PRESETS, TINY
from services.engine.checkpoint.random_init import LAYOUTS


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("checkpoint", help="checkpoint tools")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    init = actions.add_parser(
        "init", help="write a random checkpoint folder (config, safetensors, tokenizer)"
    )
    init.add_argument("--family", required=True, choices=sorted(TINY), help="model family")
    init.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="size preset (default tiny)")
    init.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    init.add_argument("--out", required=True, type=Path, help="output folder")
    init.add_argument(
        "--layout",
        default="hub",
        choices=LAYOUTS,
        help="tensor layout: hub (per-expert tensors, as released) or transformers (fused)",
    )
    init.set_defaults(run=run_init)


def run_init(args: argparse.Namespace) -> int:
    config = init_checkpoint(args.out, args.family, args.preset, args.seed, args.layout)
    what = f"{config.family} checkpoint ({args.preset}, seed {args.seed}, {args.layout} layout)"
    print(f"wrote {what} to {args.out}")
    return 0
