"""``baton bench``: ``engine`` (throughput against naive recompute) and ``kv-format`` (FP8 KV error)."""

import argparse
import json
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

from services.engine.benchmark.engine_bench import format_table, run_engine_bench
from services.engine.benchmark.kv_format_bench import measure_kv_format
from services.engine.checkpoint.init_folder import init_checkpoint
from services.engine.checkpoint.loader import load_model


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("bench", help="benchmarks (ratios against a baseline, in one run)")
    kinds = parser.add_subparsers(dest="bench", required=True, metavar="BENCH")
    engine = kinds.add_parser("engine", help="engine prefill/decode tokens/s vs naive full recompute")
    engine.add_argument(
        "--model", type=Path, help="checkpoint folder (default: a random --family/--preset one)"
    )
    engine.add_argument("--family", default="k3", choices=("k3", "kimi_linear", "deepseek_v32"))
    engine.add_argument("--preset", default="tiny", help="random checkpoint size when --model is not given")
    engine.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    engine.add_argument("--batches", default="1,4", help="comma-separated batch sizes (default 1,4)")
    engine.add_argument(
        "--contexts", default="128,512", help="comma-separated prompt lengths (default 128,512)"
    )
    engine.add_argument(
        "--decode-tokens", type=int, default=16, help="decoded tokens per request (default 16)"
    )
    engine.add_argument("--modes", default="default,invariant", help="default,invariant (default both)")
    engine.add_argument("--json", type=Path, help="also write the rows as JSON here")
    engine.set_defaults(run=run_engine)
    kv = kinds.add_parser(
        "kv-format", help="FP8 vs model-dtype KV blocks: DSA selection overlap and logprob error"
    )
    kv.add_argument("--model", type=Path, help="checkpoint folder (default: a random --family/--preset one)")
    kv.add_argument("--family", default="k3", choices=("k3", "kimi_linear", "deepseek_v32"))
    kv.add_argument("--preset", default="tiny", help="random checkpoint size when --model is not given")
    kv.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    kv.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"), help="model dtype")
    kv.add_argument("--prompts", type=int, default=4, help="random prompts (default 4)")
    kv.add_argument("--length", type=int, default=256, help="tokens per prompt (default 256)")
    kv.set_defaults(run=run_kv_format)


def _positive_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated positive integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"{flag}: expected comma-separated positive integers, got {text!r}")
    return values


def run_engine(args: argparse.Namespace) -> int:
    batches = _positive_list(args.batches, "--batches")
    contexts = _positive_list(args.contexts, "--contexts")
    modes = args.modes.split(",")
    if any(mode not in ("default", "invariant") for mode in modes):
        raise ValueError(f"--modes: expected default and/or invariant, got {args.modes!r}")
    if args.decode_tokens < 1:
        raise ValueError(f"--decode-tokens: must be >= 1, got {args.decode_tokens}")
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model
        if model_dir is None:
            model_dir = Path(scratch) / "model"
            init_checkpoint(model_dir, args.family, args.preset, seed=0)
        rows = run_engine_bench(str(model_dir), args.device, batches, contexts, args.decode_tokens, modes)
    print(
        f"engine benchmark: {args.family if args.model is None else args.model} ({args.preset}), "
        f"device {args.device}, {args.decode_tokens} decoded tokens per request"
    )
    print(format_table(rows))
    if args.json:
        args.json.write_text(json.dumps([row.as_dict() for row in rows], indent=2) + "\n")
    return 0


def run_kv_format(args: argparse.Namespace) -> int:
    if args.prompts < 1 or args.length < 2:
        raise ValueError("--prompts: must be >= 1 and --length >= 2")
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model
        if model_dir is None:
            model_dir = Path(scratch) / "model"
            init_checkpoint(model_dir, args.family, args.preset, seed=0)
        model = load_model(model_dir, device=args.device, dtype=getattr(torch, args.dtype))
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(
        0, model.config.vocab_size, (args.prompts, args.length), generator=generator
    ).tolist()
    report = measure_kv_format(model, prompts)
    print(f"KV format: FP8 against {args.dtype} blocks, {model.config.family}, {report.tokens} tokens")
    for name, value in asdict(report).items():
        print(f"  {name:<28} {value if value is None or isinstance(value, int) else f'{value:.4f}'}")
    return 0
