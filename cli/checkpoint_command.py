"""``baton checkpoint init``: write a random checkpoint folder with a tokenizer."""

import argparse
import json
from pathlib import Path

from services.engine.checkpoint.presets import PRESETS, TINY, preset_config
from services.engine.checkpoint.random_init import LAYOUTS, write_random_checkpoint
from services.engine.tokenizer import Tokenizer, write_tiny_tokenizer


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
    config = preset_config(args.family, args.preset)
    args.out.mkdir(parents=True, exist_ok=True)
    write_tiny_tokenizer(args.out, args.family, config["vocab_size"])
    tokenizer = Tokenizer.from_pretrained(args.out)
    pad_token = json.loads((args.out / "tokenizer_config.json").read_text()).get("pad_token")
    config["bos_token_id"] = tokenizer.bos_token_id
    config["eos_token_id"] = tokenizer.eos_token_ids
    config["pad_token_id"] = tokenizer.token_to_id(pad_token) if pad_token else None
    model_config = write_random_checkpoint(args.out, config, seed=args.seed, layout=args.layout)
    what = f"{model_config.family} checkpoint ({args.preset}, seed {args.seed}, {args.layout} layout)"
    print(f"wrote {what} to {args.out}")
    return 0
