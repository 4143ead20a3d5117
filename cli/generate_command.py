"""``baton generate``: greedy generation on one checkpoint, streaming text as it is decoded."""

import argparse
import sys
from pathlib import Path

import torch

from services.engine.checkpoint.loader import load_model
from services.engine.model.config_loader import load_model_config
from services.engine.model.state import ContiguousCache
from services.engine.tokenizer import IncrementalDetokenizer, Tokenizer

from .arguments import DTYPES, check_vocabulary, parse_token_ids


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("generate", help="greedy generation from a prompt (single process)")
    parser.add_argument("--model", required=True, type=Path, help="checkpoint folder")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="prompt text (needs the folder's tokenizer)")
    prompt.add_argument("--prompt-ids", help="comma-separated prompt token ids")
    parser.add_argument(
        "--chat", action="store_true", help="wrap --prompt as a user message in the chat template"
    )
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens to generate (default 32)")
    parser.add_argument(
        "--dtype", default="float32", choices=sorted(DTYPES), help="compute dtype (default float32)"
    )
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.max_tokens < 1:
        raise ValueError(f"--max-tokens: must be >= 1, got {args.max_tokens}")
    config = load_model_config(args.model)
    tokenizer = Tokenizer.from_pretrained(args.model) if args.prompt is not None else None
    if tokenizer is None:
        prompt_ids = parse_token_ids(args.prompt_ids, "--prompt-ids")
    elif args.chat:
        prompt_ids = tokenizer.encode_chat([{"role": "user", "content": args.prompt}])
    else:
        prompt_ids = tokenizer.encode(args.prompt, add_special_tokens=True)
    check_vocabulary(prompt_ids, config.vocab_size, "--prompt-ids" if tokenizer is None else "--prompt")
    model = load_model(args.model, device=args.device, dtype=DTYPES[args.dtype])
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=True) if tokenizer else None
    stop_ids = set(config.eos_token_ids)
    cache = ContiguousCache(1)
    generated: list[int] = []
    next_input = torch.tensor([prompt_ids], device=args.device)
    with torch.no_grad():
        for _ in range(args.max_tokens):
            token = int(model(next_input, cache)[0, -1].argmax())
            generated.append(token)
            if token in stop_ids:
                break
            if detokenizer:
                sys.stdout.write(detokenizer.push(token))
                sys.stdout.flush()
            next_input = torch.tensor([[token]], device=args.device)
    if detokenizer:
        sys.stdout.write(detokenizer.flush() + "\n")
    reason = "stop" if generated[-1] in stop_ids else "length"
    print(
        f"[{len(prompt_ids)} prompt tokens, {len(generated)} generated, finish={reason}] ids: "
        f"{','.join(map(str, generated))}"
    )
    return 0
