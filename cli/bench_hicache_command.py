"""``baton bench hicache``: WEKA and Mooncake trace replays with the node's host tier and without it
(later-turn TTFT, prefill tokens computed, goodput, side by side: ``deploy/benchmark/hicache_bench.py``),
or with ``--bandwidth`` the tier's host -> device load bandwidth against a plain copy
(``deploy/benchmark/hicache_bandwidth.py``)."""

import argparse
import json
import tempfile
from pathlib import Path

import torch

from deploy.benchmark.hicache_bandwidth import format_rows, measure_load_bandwidth
from deploy.benchmark.hicache_bench import MODES, HicacheSetup, measure_hicache
from deploy.benchmark.hicache_report import format_comparison
from deploy.local.managed_process import REPO
from loadtest.metrics import Slo
from services.engine.checkpoint.init_folder import init_checkpoint
from services.engine.checkpoint.presets import preset_config, with_layers
from services.engine.model.config_loader import load_model_config

from .arguments import DTYPES

DEFAULT_TRACES = ("weka_trace_0182.json", "mooncake_conversation_trace.jsonl")
TRACE_DIRS = (REPO / "shared" / "traces", REPO.parent / "shared" / "traces")


def register_hicache(kinds: argparse._SubParsersAction) -> None:
    """Add ``hicache`` to the ``bench`` subcommands."""
    bench = kinds.add_parser(
        "hicache",
        help="trace replays with vs without the host tier (later-turn TTFT, prefill computed); --bandwidth",
    )
    bench.add_argument(
        "--model", type=Path, help="checkpoint folder (default: a random --family/--preset one)"
    )
    bench.add_argument("--family", default="k3", choices=("k3", "kimi_linear", "deepseek_v32"))
    bench.add_argument(
        "--preset", default="small", help="random checkpoint size: tiny, small, full (with --layers)"
    )
    bench.add_argument("--layers", type=int, help="layers of a --preset full model (default 4)")
    bench.add_argument("--device", default="cpu", help="the workers' device: cpu or cuda (default cpu)")
    bench.add_argument(
        "--dtype", choices=sorted(DTYPES), help="the workers' model dtype (default: the checkpoint's)"
    )
    bench.add_argument(
        "--trace",
        action="append",
        type=Path,
        help=f"a Mooncake .jsonl or WEKA .json trace, repeatable (default: {', '.join(DEFAULT_TRACES)} "
        "from shared/traces)",
    )
    bench.add_argument("--scale", type=int, default=32, help="trace token divisor (default 32)")
    bench.add_argument("--requests", type=int, default=120, help="first requests of each trace (default 120)")
    bench.add_argument(
        "--copies", type=int, default=8, help="WEKA: salted copies of each session, taking turns (default 8)"
    )
    bench.add_argument(
        "--all-requests",
        action="store_true",
        help="Mooncake: the first --requests lines (default: only conversations with a later turn)",
    )
    bench.add_argument(
        "--max-tokens", type=int, default=4, help="generated tokens per request at most (default 4)"
    )
    bench.add_argument(
        "--modes",
        default="disaggregated",
        help=f"comma-separated, from {','.join(MODES)} (default disaggregated)",
    )
    bench.add_argument("--block-size", type=int, default=16, help="the workers' --block-size (default 16)")
    bench.add_argument(
        "--pool-share",
        type=float,
        default=0.1,
        help="device pool / working set (default 0.1, at least the longest request)",
    )
    bench.add_argument(
        "--snapshot-stride", type=int, default=4, help="the workers' --snapshot-stride (default 4)"
    )
    bench.add_argument("--concurrency", type=int, default=1, help="requests in flight (default 1)")
    bench.add_argument(
        "--slo-ttft-ms", type=float, default=2000.0, help="goodput's TTFT target (default 2000)"
    )
    bench.add_argument("--slo-tpot-ms", type=float, default=100.0, help="goodput's TPOT target (default 100)")
    bench.add_argument(
        "--bandwidth",
        action="store_true",
        help="instead: the tier's load path (host -> --device) GB/s per block size vs one plain copy",
    )
    bench.add_argument(
        "--block-sizes",
        default="16,32,64",
        help="--bandwidth: tokens per block, comma-separated (default 16,32,64)",
    )
    bench.add_argument("--blocks", type=int, default=256, help="--bandwidth: blocks per load (default 256)")
    bench.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    bench.set_defaults(run=run_hicache)


def run_hicache(args: argparse.Namespace) -> int:
    if args.layers is not None and args.preset != "full":
        raise ValueError("--layers: only with --preset full (the other presets fix their layers)")
    if args.device != "cpu" and not (args.device.startswith("cuda") and torch.cuda.is_available()):
        raise ValueError(f"--device: {args.device!r} is not usable here (cpu, or cuda with a GPU)")
    return _run_bandwidth(args) if args.bandwidth else _run_replays(args)


def _config(args: argparse.Namespace) -> dict:
    config = preset_config(args.family, args.preset)
    return with_layers(config, args.layers or 4) if args.preset == "full" else config


def _run_bandwidth(args: argparse.Namespace) -> int:
    try:
        sizes = [int(part) for part in args.block_sizes.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise ValueError(
            f"--block-sizes: expected comma-separated positive integers, got {args.block_sizes!r}"
        )
    config = load_model_config(args.model if args.model else _config(args))
    dtype = DTYPES[args.dtype] if args.dtype else getattr(torch, config.torch_dtype)
    rows = measure_load_bandwidth(config, dtype, args.device, sizes, args.blocks)
    if args.json:
        print(json.dumps([row.as_dict() for row in rows]))
    else:
        print(f"model: {args.model or f'{args.family} ({args.preset})'}, {dtype}")
        print(format_rows(rows, args.device))
    return 0


def _run_replays(args: argparse.Namespace) -> int:
    traces = [str(path) for path in (args.trace or _default_traces())]
    modes = tuple(mode.strip() for mode in args.modes.split(","))
    for flag, value in (("--slo-ttft-ms", args.slo_ttft_ms), ("--slo-tpot-ms", args.slo_tpot_ms)):
        if not value > 0:
            raise ValueError(f"{flag}: must be > 0, got {value}")
    if args.copies < 1:
        raise ValueError(f"--copies: must be >= 1, got {args.copies}")
    setup = HicacheSetup(
        scale=args.scale,
        requests=args.requests,
        copies=args.copies,
        multi_turn_only=not args.all_requests,
        max_tokens=args.max_tokens,
        block_size=args.block_size,
        pool_share=args.pool_share,
        snapshot_stride=args.snapshot_stride,
        concurrency=args.concurrency,
        slo=Slo(ttft_s=args.slo_ttft_ms / 1e3, tpot_s=args.slo_tpot_ms / 1e3),
        worker_args=("--device", args.device),
        dtype=args.dtype,
    )
    name = args.model or f"random {args.family} ({args.preset})"
    if args.json:
        progress = on_comparison = lambda found: None
    else:
        print(
            f"model: {name}, device {args.device}, scale {args.scale}, {args.requests} requests per trace, "
            f"concurrency {args.concurrency}",
            flush=True,
        )

        def progress(line: str) -> None:
            print(f"... {line}", flush=True)

        def on_comparison(comparison) -> None:  # each table as soon as it is done
            print(format_comparison(comparison), flush=True)

    with tempfile.TemporaryDirectory() as scratch:
        model = args.model
        if model is None:
            model = Path(scratch) / f"{args.family}-{args.preset}"
            overrides = _config(args) if args.preset == "full" else None
            init_checkpoint(model, args.family, args.preset, seed=0, overrides=overrides)
        comparisons = measure_hicache(str(model), traces, modes, setup, progress, on_comparison)
    if args.json:
        print(json.dumps({"model": str(name), "comparisons": [c.as_dict() for c in comparisons]}))
    return 0


def _default_traces() -> list[Path]:
    for folder in TRACE_DIRS:
        if all((folder / name).is_file() for name in DEFAULT_TRACES):
            return [folder / name for name in DEFAULT_TRACES]
    raise ValueError(
        f"--trace: none given and {', '.join(DEFAULT_TRACES)} are not in {TRACE_DIRS[0]} or {TRACE_DIRS[1]}"
    )
