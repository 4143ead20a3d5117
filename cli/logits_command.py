"""``baton logits``: full-sequence logits of a checkpoint for given token ids, saved as ``.npy``."""

import argparse
from pathlib import Path

import numpy as np
import torch

from services.engine.checkpoint.loader import load_model
from services.engine.model.config_loader import load_model_config

from .arguments import DTYPES, check_vocabulary, parse_token_ids


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("logits", help="write full-sequence logits [T, vocab] as float32 .npy")
    parser.add_argument("--model", required=True, type=Path, help="checkpoint folder (no tokenizer needed)")
    parser.add_argument("--input-ids", required=True, help="comma-separated token ids, e.g. 5,17,42")
    parser.add_argument(
        "--dtype", default="float32", choices=sorted(DTYPES), help="compute dtype (default float32)"
    )
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--out", required=True, type=Path, help="output .npy file")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    ids = parse_token_ids(args.input_ids, "--input-ids")
    config = load_model_config(args.model)  # validates before any weight is read
    check_vocabulary(ids, config.vocab_size, "--input-ids")
    model = load_model(args.model, device=args.device, dtype=DTYPES[args.dtype])
    with torch.no_grad():
        logits = model(torch.tensor([ids], device=args.device))[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.save(args.out, logits.float().cpu().numpy())
    print(f"wrote logits {list(logits.shape)} to {args.out}")
    return 0
