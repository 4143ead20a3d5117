"""``baton bench faults``: hundreds of streaming requests while workers are SIGKILLed, handoffs fail,
clients cancel and deadlines expire; reports outcomes, leaks, router availability and recovery. With
``--hicache``: HiCache's faults instead, the node's tier and then Redis SIGKILLed under multi-turn sessions
(``deploy/benchmark/faults/tier_faults.py``)."""

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

from deploy.benchmark.faults import (
    FaultScenario,
    SessionPlan,
    TierFaultScenario,
    measure_faults,
    run_tier_faults,
    tier_fault_cluster,
)
from deploy.benchmark.worker_threads import worker_threads
from services.engine.checkpoint.init_folder import init_checkpoint


def register_faults(kinds: argparse._SubParsersAction) -> None:
    """Add ``faults`` to the ``bench`` subcommands."""
    faults = kinds.add_parser(
        "faults",
        help="streams under SIGKILLs, failed handoffs, cancels and deadlines: leaks, availability, recovery",
    )
    faults.add_argument(
        "--model", type=Path, help="checkpoint folder (default: a random --family/--preset one)"
    )
    faults.add_argument("--family", default="k3", choices=("k3", "kimi_linear", "deepseek_v32"))
    faults.add_argument("--preset", default="tiny", help="random checkpoint size when --model is not given")
    faults.add_argument("--prefill-workers", type=int, default=2, help="(default 2)")
    faults.add_argument("--decode-workers", type=int, default=2, help="(default 2)")
    faults.add_argument("--requests", type=int, default=1000, help="(default 1000)")
    faults.add_argument("--concurrency", type=int, default=200, help="streams in flight (default 200)")
    faults.add_argument(
        "--prompt-tokens", default="8,256", help="MIN,MAX uniform prompt length (default 8,256)"
    )
    faults.add_argument("--max-tokens", type=int, default=16, help="tokens per request (default 16)")
    faults.add_argument("--kills-prefill", type=int, default=2, help="prefill SIGKILLs (default 2)")
    faults.add_argument("--kills-decode", type=int, default=2, help="decode SIGKILLs (default 2)")
    faults.add_argument(
        "--fail-transfers",
        type=int,
        default=5,
        help="each prefill worker's first N handoffs fail (default 5)",
    )
    faults.add_argument(
        "--cancel-fraction", type=float, default=0.2, help="clients that cancel (default 0.2)"
    )
    faults.add_argument(
        "--deadline-fraction", type=float, default=0.2, help="requests with a tight deadline (default 0.2)"
    )
    faults.add_argument(
        "--deadlines-ms", default="1,50,500", help="tight deadlines to draw from (default 1,50,500)"
    )
    faults.add_argument(
        "--client-attempts", type=int, default=1, help="SDK attempts per request (default 1: no retry)"
    )
    faults.add_argument(
        "--leak-bound-s",
        type=float,
        default=30.0,
        help="time the workers get to free everything (default 30)",
    )
    faults.add_argument("--seed", type=int, default=0, help="fixes every prompt, cancel point and deadline")
    faults.add_argument("--json", type=Path, help="also write the whole report as JSON here")
    hicache = faults.add_argument_group(
        "HiCache's faults (--hicache: one prefill and one decode worker, the node tier, a redis-server; the "
        "request, kill, cancel and deadline flags above do not apply)"
    )
    hicache.add_argument(
        "--hicache",
        action="store_true",
        help="kill the node's HiCache tier, then Redis, under multi-turn sessions (needs redis-server)",
    )
    hicache.add_argument("--sessions", type=int, default=4, help="sessions running at once (default 4)")
    faults.set_defaults(run=run_bench_faults)


def _numbers(text: str, flag: str, kind=int) -> tuple:
    try:
        return tuple(kind(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated numbers, got {text!r}") from None


def run_bench_faults(args: argparse.Namespace) -> int:
    """Exit 0 when the run met every expectation (acceptable statuses, nothing leaked, the router
    always answered in time, the cluster served afterwards), else 1; the table says what failed."""
    if args.hicache:
        return run_bench_tier_faults(args)
    prompt_tokens = _numbers(args.prompt_tokens, "--prompt-tokens")
    if len(prompt_tokens) != 2:
        raise ValueError(f"--prompt-tokens: expected MIN,MAX, got {args.prompt_tokens!r}")
    scenario = FaultScenario(
        requests=args.requests,
        concurrency=args.concurrency,
        prompt_tokens=prompt_tokens,
        max_tokens=args.max_tokens,
        cancel_fraction=args.cancel_fraction,
        deadline_fraction=args.deadline_fraction,
        deadlines_s=tuple(ms / 1e3 for ms in _numbers(args.deadlines_ms, "--deadlines-ms", float)),
        kills_prefill=args.kills_prefill,
        kills_decode=args.kills_decode,
        fail_transfers=args.fail_transfers,
        client_attempts=args.client_attempts,
        seed=args.seed,
    )
    for flag, value in (
        ("--prefill-workers", args.prefill_workers),
        ("--decode-workers", args.decode_workers),
    ):
        if value < 1:
            raise ValueError(f"{flag}: must be >= 1, got {value}")
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model
        if model_dir is None:
            model_dir = Path(scratch) / f"{args.family}-{args.preset}"
            init_checkpoint(model_dir, args.family, args.preset, seed=0)
        report = measure_faults(
            str(model_dir),
            scenario,
            args.prefill_workers,
            args.decode_workers,
            leak_bound_s=args.leak_bound_s,
        )
    if args.model is None:
        report = replace(report, model=f"random {args.family} ({args.preset})")
    print(report.format_table())
    if args.json:
        args.json.write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    summary = report.summary()
    met = (
        summary["unexpected_outcomes"] == 0
        and report.leaks.clean
        and summary["router_availability"] == 1.0
        and summary["served_after"] == "OK"
    )
    return 0 if met else 1


def run_bench_tier_faults(args: argparse.Namespace) -> int:
    """``--hicache``: exit 0 when no turn failed, the tier came back and was loaded from again, Redis down
    and back showed on both gauges with the index written back, and the workers held nothing; else 1."""
    scenario = TierFaultScenario(sessions=SessionPlan(sessions=args.sessions, seed=args.seed))
    with tempfile.TemporaryDirectory() as scratch, worker_threads(1):
        model_dir = args.model
        if model_dir is None:
            model_dir = Path(scratch) / f"{args.family}-{args.preset}"
            init_checkpoint(model_dir, args.family, args.preset, seed=0)
        cluster = tier_fault_cluster(str(model_dir), scenario)
        try:
            report = run_tier_faults(cluster, str(model_dir), scenario)
        finally:
            cluster.stop()
    if args.model is None:
        report = replace(report, model=f"random {args.family} ({args.preset})")
    print(report.format_table())
    if args.json:
        args.json.write_text(json.dumps(report.as_dict(), indent=2) + "\n")
    kill, outage = report.tier_kill, report.redis_outage
    met = (
        not report.failed()
        and kill.tier_hit_s is not None
        and outage.reported_down_s is not None
        and outage.reported_up_s is not None
        and outage.index_republished
        and report.leaks.clean
    )
    return 0 if met else 1
