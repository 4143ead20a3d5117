"""``baton bench``: ``engine`` (decode and prefill throughput per kernel backend, against the weights-once
bound and transformers' model), ``kernels`` (per-op kernels at real shapes against their limits),
``kv-format`` (FP8 KV error), ``transfer`` (NIXL and gRPC-bytes GB/s against an in-memory copy), ``pd``
(decode latency under long prefills, colocated against disaggregated), ``router-latency`` (what the
router adds to a short request, against a direct call to the decode worker), ``faults``
(``bench_faults_command``), ``fuzz`` (bad requests: never a 5xx, still serving), ``hicache`` (trace
replays with vs without the host tier, and its load bandwidth: ``bench_hicache_command``) and ``spec``
(speculative decoding against plain decoding: ``bench_spec_command``), ``grammar`` (structured output's
compile and per-token mask cost per grammar library: ``bench_grammar_command``)."""

import argparse
import json
import re
import tempfile
import textwrap
from dataclasses import asdict, replace
from pathlib import Path

import torch

from common.byte_sizes import parse_sizes, size_name
from deploy.benchmark import PDWorkload, measure_pd
from deploy.benchmark.fuzz_bench import check_target, fuzz_cluster, run_fuzz
from deploy.benchmark.fuzz_client import FuzzClient
from deploy.benchmark.pd_bench import DISAGGREGATED_MODES, check_setup
from deploy.benchmark.router_latency import measure_router_latency
from services.config_flags import add_config_flags
from services.engine.benchmark.engine_bench import format_busiest, format_table, run_engine_bench
from services.engine.benchmark.kernel_bench import KERNEL_BENCHES, format_results, make_context, resolve
from services.engine.benchmark.kv_format_bench import measure_kv_format
from services.engine.checkpoint.init_folder import init_checkpoint
from services.engine.checkpoint.loader import load_model
from services.engine.checkpoint.random_model import build_random_model
from services.engine.engine_config import EngineConfig
from services.engine.model.backends import KERNEL_BACKENDS
from services.transfer import known_backends
from services.transfer.bandwidth import measure_bandwidth, measure_copy_bandwidth

from .arguments import DTYPES, positive_int_list
from .bench_faults_command import register_faults
from .bench_grammar_command import register_grammar
from .bench_hicache_command import register_hicache
from .bench_model import add_model_flags, bench_model
from .bench_spec_command import register_spec
from .bench_trust_command import register_trust


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("bench", help="benchmarks (ratios against a baseline, in one run)")
    kinds = parser.add_subparsers(dest="bench", required=True, metavar="BENCH")
    engine = kinds.add_parser(
        "engine", help="engine tokens/s per kernel backend vs the weights-once bound and transformers"
    )
    engine.add_argument(
        "--model", type=Path, help="checkpoint folder (default: a random --family/--preset one)"
    )
    engine.add_argument("--family", default="k3", choices=("k3", "kimi_linear", "deepseek_v32"))
    engine.add_argument(
        "--preset",
        default="tiny",
        help="random model size when --model is not given: tiny, small (written to disk), full (real "
        "per-layer shapes, built on the device; with --layers)",
    )
    engine.add_argument("--layers", type=int, help="layers of a --preset full model (default 4)")
    add_config_flags(engine, EngineConfig, only=("device", "cuda_graphs"))
    engine.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES), help="--preset full dtype")
    engine.add_argument("--batches", default="1,4", help="comma-separated batch sizes (default 1,4)")
    engine.add_argument(
        "--contexts", default="128,512", help="comma-separated prompt lengths (default 128,512)"
    )
    engine.add_argument(
        "--decode-tokens", type=int, default=16, help="decoded tokens per request (default 16)"
    )
    engine.add_argument("--modes", default="default", help="default and/or invariant (default: default)")
    engine.add_argument(
        "--kernels",
        default=None,
        help="comma-separated backends to compare (default: reference,triton on CUDA, reference on the CPU)",
    )
    engine.add_argument(
        "--peer", default=True, action=argparse.BooleanOptionalAction, help="run transformers' model too"
    )
    engine.add_argument(
        "--top-kernels",
        type=int,
        default=0,
        metavar="N",
        help="also print each row's N kernels with the most device time in a decode step (CUDA; default 0)",
    )
    engine.add_argument("--json", type=Path, help="also write the report as JSON here")
    engine.set_defaults(run=run_engine)
    kernels = kinds.add_parser(
        "kernels",
        help="per-op kernels at real shapes vs copy bandwidth / matrix rate (CUDA only)",
        description=textwrap.fill(
            "Per-op kernels at the full preset's shapes (K3: Kimi-Linear-48B-A3B layers plus the DSA "
            "indexer) on a CUDA device, each row against a limit measured in the same run (copy bandwidth "
            "or matrix rate) and, where there is one, a peer kernel. Ops (--ops):",
            88,
        )
        + "\n"
        + "\n".join(f"  {name:<9} {bench.summary}" for name, bench in KERNEL_BENCHES.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    kernels.add_argument(
        "--ops",
        default=",".join(KERNEL_BENCHES),
        help=f"comma-separated, from the list above (default: all, {','.join(KERNEL_BENCHES)})",
    )
    kernels.add_argument("--device", default="cuda", help="cuda or cuda:N (default cuda)")
    kernels.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES), help="(default bfloat16)")
    kernels.add_argument("--json", type=Path, help="also write the rows as JSON here")
    kernels.set_defaults(run=run_kernels)
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
    transfer = kinds.add_parser(
        "transfer", help="transfer backends' GB/s between two processes vs an in-memory copy"
    )
    transfer.add_argument(
        "--sizes",
        default="64K,256K,1M,4M,16M,64M",
        help="comma-separated block sizes, K/M/G = KiB/MiB/GiB (default 64K,256K,1M,4M,16M,64M)",
    )
    transfer.add_argument(
        "--backends", default="nixl,grpc_bytes", help="comma-separated backends (default nixl,grpc_bytes)"
    )
    transfer.add_argument("--device", default="cpu", help="the sender's buffers: cpu or cuda:N (default cpu)")
    transfer.add_argument(
        "--peer-device", default=None, help="the receiver's buffers (default: --device), e.g. cuda:1"
    )
    transfer.add_argument("--json", type=Path, help="also write the rows as JSON here")
    transfer.set_defaults(run=run_transfer)
    _register_pd(kinds)
    _register_router_latency(kinds)
    register_faults(kinds)
    _register_fuzz(kinds)
    register_hicache(kinds)
    register_spec(kinds)
    register_trust(kinds)
    register_grammar(kinds)


def _register_pd(kinds: argparse._SubParsersAction) -> None:
    pd = kinds.add_parser(
        "pd", help="decode TPOT/ITL under long prefills: colocated vs disaggregated cluster, same workers"
    )
    add_model_flags(pd)
    # The workers' engine flags this benchmark varies; None leaves the worker's default.
    add_config_flags(
        pd, EngineConfig, only=("dtype", "max_num_batched_tokens"), defaults={"max_num_batched_tokens": None}
    )
    pd.add_argument(
        "--prefill-workers", type=int, default=1, help="disaggregated prefill workers (default 1)"
    )
    pd.add_argument("--decode-workers", type=int, default=1, help="disaggregated decode workers (default 1)")
    pd.add_argument(
        "--disaggregation", default="conditional", choices=DISAGGREGATED_MODES, help="(default conditional)"
    )
    pd.add_argument(
        "--transfer-backend",
        default="nixl",
        help="the workers' handoff backend, nixl or grpc_bytes (default nixl)",
    )
    pd.add_argument("--decode-streams", type=int, default=4, help="concurrent decode streams (default 4)")
    pd.add_argument("--decode-tokens", type=int, default=32, help="tokens per decode request (default 32)")
    pd.add_argument("--rounds", type=int, default=4, help="decode requests per stream (default 4)")
    pd.add_argument("--prefill-len", type=int, default=1536, help="long prompt tokens (default 1536)")
    pd.add_argument("--prefills", type=int, default=6, help="long prefills, back to back (default 6)")
    pd.add_argument("--seed", type=int, default=0, help="fixes every prompt (default 0)")
    pd.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    pd.set_defaults(run=run_pd)


def _register_router_latency(kinds: argparse._SubParsersAction) -> None:
    bench = kinds.add_parser(
        "router-latency", help="latency the router adds: Generate through it vs Decode straight to the worker"
    )
    add_model_flags(bench)
    add_config_flags(bench, EngineConfig, only=("dtype",))  # the worker's model dtype
    bench.add_argument("--requests", type=int, default=200, help="timed requests per path (default 200)")
    bench.add_argument("--warmup", type=int, default=20, help="untimed requests per path first (default 20)")
    bench.add_argument("--prompt-tokens", type=int, default=8, help="prompt length (default 8)")
    bench.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    bench.set_defaults(run=run_router_latency)


def _register_fuzz(kinds: argparse._SubParsersAction) -> None:
    fuzz = kinds.add_parser(
        "fuzz", help="random bad requests over gRPC and HTTP: no 5xx, no hang, named fields, still serving"
    )
    fuzz.add_argument("--cases", type=int, default=10_000, help="cases to send (default 10000)")
    fuzz.add_argument("--seed", type=int, default=0, help="replays a run (default 0)")
    fuzz.add_argument("--target", help="router gRPC host:port (default: start a local cluster)")
    fuzz.add_argument("--http-target", help="router OpenAI HTTP host:port (default: the local cluster's)")
    fuzz.add_argument(
        "--allow-remote", action="store_true", help="allow targets that are not loopback addresses"
    )
    fuzz.add_argument("--deadline-s", type=float, default=30.0, help="per-case deadline (default 30)")
    fuzz.add_argument("--model", type=Path, help="local cluster's checkpoint (default: a random tiny one)")
    fuzz.add_argument("--family", default="kimi_linear", choices=("k3", "kimi_linear", "deepseek_v32"))
    fuzz.add_argument("--json", type=Path, help="also write the report as JSON here")
    fuzz.set_defaults(run=run_fuzz_bench)


def run_engine(args: argparse.Namespace) -> int:
    batches = positive_int_list(args.batches, "--batches")
    contexts = positive_int_list(args.contexts, "--contexts")
    modes = args.modes.split(",")
    if any(mode not in ("default", "invariant") for mode in modes):
        raise ValueError(f"--modes: expected default and/or invariant, got {args.modes!r}")
    default_kernels = "reference,triton" if args.device.startswith("cuda") else "reference"
    backends = (args.kernels or default_kernels).split(",")
    if any(name not in KERNEL_BACKENDS for name in backends) or len(set(backends)) != len(backends):
        raise ValueError(
            f"--kernels: expected distinct names from {', '.join(KERNEL_BACKENDS)}, got {args.kernels!r}"
        )
    if args.decode_tokens < 1:
        raise ValueError(f"--decode-tokens: must be >= 1, got {args.decode_tokens}")
    if args.top_kernels < 0:
        raise ValueError(f"--top-kernels: must be >= 0, got {args.top_kernels}")
    if args.layers is not None and args.preset != "full":
        raise ValueError("--layers: only with --preset full (the other presets fix their layers)")
    with tempfile.TemporaryDirectory() as scratch:
        model_dir, prebuilt = args.model, None
        if model_dir is None and args.preset == "full":
            model_dir = f"{args.family}-full-{args.layers or 4}-layers"
            prebuilt = build_random_model(
                args.family, "full", args.device, DTYPES[args.dtype], args.layers or 4
            )
        elif model_dir is None:
            model_dir = Path(scratch) / "model"
            init_checkpoint(model_dir, args.family, args.preset, seed=0)
        report = run_engine_bench(
            str(model_dir),
            args.device,
            batches,
            contexts,
            args.decode_tokens,
            modes,
            backends,
            cuda_graphs=args.cuda_graphs,
            prebuilt=prebuilt,
            peer=args.peer,
        )
    print(
        f"engine benchmark: {args.family if args.model is None else args.model} ({args.preset}), "
        f"device {args.device}, {args.decode_tokens} decoded tokens per request, "
        f"CUDA graphs {'on' if args.cuda_graphs else 'off'}"
    )
    print(format_table(report))
    if args.top_kernels:
        print(format_busiest(report, args.top_kernels))
    if args.json:
        args.json.write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    return 0


def run_kernels(args: argparse.Namespace) -> int:
    ops = [op.strip() for op in args.ops.split(",")]
    functions = resolve(ops)  # a bad name fails before anything is measured
    _check_cuda_device(args.device)
    if ":" in args.device:  # Triton and CUDA graphs run on the current device
        torch.cuda.set_device(torch.device(args.device))
    results = []
    with torch.inference_mode():
        context = make_context(args.device, DTYPES[args.dtype])
        print(
            f"kernel benchmark: {args.device} ({torch.cuda.get_device_name(args.device)}), {args.dtype}, "
            f"K3-shaped layers; measured limits: copy {context.copy_bytes_per_s / 1e9:.0f} GB/s, matmul "
            f"{context.matmul_flops / 1e12:.1f} TFLOP/s",
            flush=True,
        )
        for function in functions:  # each op's table as soon as it is done
            rows = function(context)
            print(format_results(rows, ""), flush=True)
            results += rows
    if args.json:
        args.json.write_text(json.dumps([r.as_dict() for r in results], indent=2) + "\n")
    return 0


def _check_cuda_device(device: str) -> None:
    """Refuse, at start, a ``--device`` that is not a visible CUDA device (every op runs GPU kernels)."""
    need = "--device: baton bench kernels needs a CUDA device"
    if not re.fullmatch(r"cuda(:\d+)?", device):
        raise ValueError(f"{need} (cuda or cuda:N), got {device!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"{need}, and none is visible here (got {device!r})")
    if ":" in device and int(device.split(":")[1]) >= torch.cuda.device_count():
        raise ValueError(f"{need}: {device!r}, and {torch.cuda.device_count()} are visible")


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
        print(f"  {name:<34} {value if value is None or isinstance(value, int) else f'{value:.4f}'}")
    return 0


def run_transfer(args: argparse.Namespace) -> int:
    sizes = parse_sizes(args.sizes, "--sizes")
    backends = [name.strip() for name in args.backends.split(",")]
    unknown = [name for name in backends if name not in known_backends()]
    if unknown or len(set(backends)) != len(backends):
        raise ValueError(
            f"--backends: expected distinct names from {known_backends()}, got {args.backends!r}"
        )
    peer = args.peer_device or args.device
    for flag, device in (("--device", args.device), ("--peer-device", peer)):
        if device != "cpu" and not (device.startswith("cuda") and torch.cuda.is_available()):
            raise ValueError(f"{flag}: {device!r} is not usable here (cpu, or cuda:N with a GPU)")
    measured = {
        name: measure_bandwidth(sizes, name, device=args.device, peer_device=peer) for name in backends
    }
    # The limit is timed alone, after the receivers have stopped.
    limits = measure_copy_bandwidth(sizes, args.device, peer)
    rows = []
    for index, size in enumerate(sizes):
        copy = limits[index]
        row = {"size_bytes": size, "copy_gbps": copy}
        for name in backends:
            row[f"{name}_gbps"] = measured[name][index]["transfer_gbps"]
            row[f"{name}_vs_copy"] = row[f"{name}_gbps"] / copy
        if len(backends) == 2:
            first, second = backends
            row[f"{first}_vs_{second}"] = row[f"{first}_gbps"] / row[f"{second}_gbps"]
        rows.append(row)
    print(
        f"transfer benchmark: one row per write, sender ({args.device}) -> a second process ({peer}) on "
        "this host, median GB/s; copy = torch copy between the same devices"
    )
    columns = [f"{name} GB/s" for name in backends] + ["copy GB/s"]
    columns += [f"{name}/copy" for name in backends]
    columns += [f"{backends[0]}/{backends[1]}"] if len(backends) == 2 else []
    print(f"{'size':>8} " + " ".join(f"{column:>17}" for column in columns))
    for row in rows:
        values = [row[f"{name}_gbps"] for name in backends] + [row["copy_gbps"]]
        values += [row[f"{name}_vs_copy"] for name in backends]
        values += [row[f"{backends[0]}_vs_{backends[1]}"]] if len(backends) == 2 else []
        print(f"{size_name(row['size_bytes']):>8} " + " ".join(f"{value:>17.3f}" for value in values))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


def run_pd(args: argparse.Namespace) -> int:
    workload = PDWorkload(
        decode_streams=args.decode_streams,
        decode_tokens=args.decode_tokens,
        rounds=args.rounds,
        prefill_len=args.prefill_len,
        prefills=args.prefills,
        seed=args.seed,
    )
    check_setup(args.prefill_workers, args.decode_workers, args.disaggregation, args.transfer_backend)
    worker_args = ("--dtype", args.dtype) if args.dtype else ()
    if args.max_num_batched_tokens is not None:
        if args.max_num_batched_tokens < 1:
            raise ValueError(f"--max-num-batched-tokens: must be >= 1, got {args.max_num_batched_tokens}")
        worker_args += ("--max-num-batched-tokens", str(args.max_num_batched_tokens))
    with bench_model(args) as (model, name):
        report = measure_pd(
            model,
            workload,
            args.prefill_workers,
            args.decode_workers,
            args.disaggregation,
            args.transfer_backend,
            worker_args,
        )
    report = replace(report, model=name)
    print(json.dumps(report.as_dict()) if args.json else report.format_table())
    return 0


def run_router_latency(args: argparse.Namespace) -> int:
    worker_args = ("--dtype", args.dtype) if args.dtype else ()
    with bench_model(args) as (model, name):
        report = measure_router_latency(model, args.requests, args.prompt_tokens, args.warmup, worker_args)
    report = replace(report, model=name)
    print(json.dumps(report.as_dict()) if args.json else report.format_table())
    return 0


def run_fuzz_bench(args: argparse.Namespace) -> int:
    """Fuzz the given targets, or a local cluster when none is given; exit 1 on any finding."""
    check_target(args.target, "--target", args.allow_remote)
    check_target(args.http_target, "--http-target", args.allow_remote)
    if not args.deadline_s > 0:
        raise ValueError(f"--deadline-s: must be > 0, got {args.deadline_s}")

    def progress(done: int) -> None:
        print(f"  {done} cases", flush=True)

    if args.target or args.http_target:
        client = FuzzClient(args.target, args.http_target, args.deadline_s)
        try:
            report = run_fuzz(client, args.cases, args.seed, progress)
        finally:
            client.close()
    else:
        with tempfile.TemporaryDirectory() as scratch:
            model_dir = args.model
            if model_dir is None:
                model_dir = Path(scratch) / f"{args.family}-tiny"
                init_checkpoint(model_dir, args.family, "tiny", seed=0)
            with fuzz_cluster(str(model_dir), ("--dtype", "float32")) as cluster:
                client = FuzzClient(
                    f"127.0.0.1:{cluster.port}", f"127.0.0.1:{cluster.router.http_port}", args.deadline_s
                )
                try:
                    report = run_fuzz(client, args.cases, args.seed, progress)
                finally:
                    client.close()
                report.worker_restarts = sum(worker.restarts for worker in cluster.workers)
    print(report.format())
    if args.json:
        args.json.write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    return 0 if report.passed else 1
