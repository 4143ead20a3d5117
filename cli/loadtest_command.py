"""``baton loadtest``: drive a workload against a running server and write a report.

    baton loadtest --target grpc://127.0.0.1:50051 --workload multiturn --sweep 1,2,4,8 \\
        --duration 60 --warmup 4 --slo-ttft-ms 2000 --slo-tpot-ms 100 --out runs/multiturn

Exit status: 0, 1 when the run is not a valid measurement (more than 10% of its requests failed,
or none finished), 2 for bad input (the message names the flag), 130 after Ctrl-C (the report of
what finished is still written).
"""

import argparse
import math
import sys

from loadtest.clients import parse_target
from loadtest.drivers import PROCESSES, Limits
from loadtest.metrics import MAX_VALID_ERROR_RATE, Slo
from loadtest.report import INDEX_FILE, write_report
from loadtest.runner import RunPlan, run_plan
from loadtest.scrape import metrics_url

from .arguments import parse_token_ids
from .loadtest_options import add_workload_flags, workload_from_args
from .tls_flags import add_client_tls_flags, client_tls_from
from .token_file import read_token_file


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "loadtest",
        help="load-test a running server (gRPC or OpenAI HTTP) and write a report",
        description="Send a workload to a server and write summary.json, requests.csv, plots, index.html.",
    )
    parser.add_argument(
        "--target", required=True, help="grpc://HOST:PORT (a Baton router) or http://HOST:PORT (OpenAI API)"
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="report folder (created if missing)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", type=int, metavar="N", help="N live sessions at once (default 1)")
    mode.add_argument("--sweep", metavar="N,N,...", help="concurrency levels run one after another")
    mode.add_argument("--rate", type=float, metavar="R", help="open loop: R session arrivals per second")
    mode.add_argument("--schedule", action="store_true", help="replay the workload's timestamps")
    parser.add_argument("--arrival", choices=PROCESSES, default=None, help="--rate process (default poisson)")
    parser.add_argument("--burstiness", type=float, metavar="B", help="gamma shape: 1 Poisson, < 1 burstier")
    limits = parser.add_argument_group("limits (per sweep level)")
    limits.add_argument("--duration", type=float, default=None, metavar="S", help="seconds, warm-up included")
    limits.add_argument(
        "--max-requests", type=int, default=None, metavar="N", help="requests, warm-up included"
    )
    limits.add_argument("--warmup", type=int, default=0, metavar="N", help="first N requests are warm-up")
    limits.add_argument(
        "--warmup-s", type=float, default=0.0, metavar="S", help="first S seconds are warm-up"
    )
    limits.add_argument(
        "--time-scale", type=float, default=1.0, metavar="F", help="divide workload waits by F (inf: none)"
    )
    report = parser.add_argument_group("report")
    report.add_argument("--slo-ttft-ms", type=float, default=None, metavar="X", help="goodput TTFT target")
    report.add_argument("--slo-tpot-ms", type=float, default=None, metavar="Y", help="goodput TPOT target")
    report.add_argument(
        "--metrics-url", default=None, metavar="URL", help="server /metrics, read before and after"
    )
    report.add_argument("--instances", type=int, default=1, metavar="N", help="divide throughput by N")
    report.add_argument("--label", default=None, help="the run's name in plots (default: the workload's)")
    parser.add_argument("--model", default=None, help="HTTP: the model field (default: left out)")
    parser.add_argument(
        "--token-file",
        default=None,
        metavar="FILE",
        help="the router's bearer token: the first field of the file's first line that is not blank "
        "or a # comment (for a router with --auth-token-file)",
    )
    parser.add_argument(
        "--request-timeout", type=float, default=600.0, metavar="S", help="limit per request (default 600)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    add_client_tls_flags(parser)
    add_workload_flags(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    token = read_token_file(args.token_file)  # first: a missing file fails before any work
    tls = client_tls_from(args)
    plan = plan_from_args(args)
    slo = slo_from_args(args)
    if args.instances < 1:
        raise ValueError(f"--instances: must be at least 1, got {args.instances}")
    workload = workload_from_args(args)
    outcome = run_plan(plan, workload, token=token, tls=tls)
    config = {
        "label": args.label or workload.name,
        "plan": plan.to_dict(),
        "workload": {"name": workload.name, "description": workload.description, "meta": workload.meta},
        **outcome.facts(),
    }
    result = outcome.result
    summary = write_report(
        args.out, result.records, result.measured_s, slo, config, outcome.server, args.instances,
        outcome.level_durations_s(),
    )  # fmt: skip
    print(summary_table(summary))
    for name, delta in outcome.server.items():
        print(f"server {name}: {delta}")
    if result.cancelled:
        print(f"{result.cancelled} requests in flight at the end were cancelled (not counted)")
    print(f"report: {args.out}/{INDEX_FILE}")
    if result.interrupted:
        print("baton loadtest: interrupted; the report covers what finished", file=sys.stderr)
        return 130
    if not summary["valid"]:
        rate = summary["error_rate"]
        why = "no request was measured" if rate is None else f"{rate:.1%} of requests failed"
        print(f"baton loadtest: invalid run: {why} (limit {MAX_VALID_ERROR_RATE:.0%})", file=sys.stderr)
        return 1
    return 0


def plan_from_args(args: argparse.Namespace) -> RunPlan:
    """The run plan; ValueError naming the flag for a bad or inconsistent value."""
    target = parse_target(args.target, explicit=True)
    if args.rate is None and (args.arrival is not None or args.burstiness is not None):
        raise ValueError(f"{'--arrival' if args.arrival else '--burstiness'}: only with --rate")
    arrival = args.arrival or ("gamma" if args.burstiness is not None else "poisson")
    if arrival == "poisson" and args.burstiness is not None:
        raise ValueError("--burstiness: only with --arrival gamma")
    if args.sweep is not None:
        mode, levels = "concurrency", tuple(parse_token_ids(args.sweep, "--sweep"))
    elif args.rate is not None:
        mode, levels = "rate", (1,)
    elif args.schedule:
        mode, levels = "schedule", (1,)
    else:
        mode, levels = "concurrency", (args.concurrency if args.concurrency is not None else 1,)
    if mode == "concurrency" and any(level < 1 for level in levels):
        raise ValueError(f"{'--sweep' if args.sweep else '--concurrency'}: session counts must be positive")
    if args.sweep is not None and args.duration is None and args.max_requests is None:
        raise ValueError("--sweep: give --duration or --max-requests to bound each level")
    limits = Limits(
        duration_s=args.duration,
        max_requests=args.max_requests,
        warmup_requests=args.warmup,
        warmup_s=args.warmup_s,
        time_scale=args.time_scale,
    )
    url = metrics_url(args.metrics_url, explicit=True) if args.metrics_url else None
    return RunPlan(
        target=target,
        mode=mode,
        levels=levels,
        rate=args.rate,
        arrival=arrival,
        burstiness=1.0 if args.burstiness is None else args.burstiness,
        seed=args.seed,
        limits=limits,
        metrics_url=url,
        model=args.model,
        request_timeout_s=args.request_timeout,
        progress=not args.no_progress,
    )


def slo_from_args(args: argparse.Namespace) -> Slo:
    for flag, value in (("--slo-ttft-ms", args.slo_ttft_ms), ("--slo-tpot-ms", args.slo_tpot_ms)):
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{flag}: must be a positive number of milliseconds, got {value}")
    to_s = lambda ms: None if ms is None else ms / 1e3  # noqa: E731
    return Slo(ttft_s=to_s(args.slo_ttft_ms), tpot_s=to_s(args.slo_tpot_ms))


_COLUMNS = (
    ("level", 16), ("ok", 6), ("failed", 6), ("req/s", 8), ("out tok/s", 10), ("TTFT p50/p99 ms", 16),
    ("TPOT p50/p99 ms", 16), ("ITL p50 ms", 10), ("cached", 7), ("goodput/s", 9),
)  # fmt: skip


def summary_table(summary: dict) -> str:
    """One row per level (and ``all`` when there are several), from ``summary.json``'s content."""
    rows = [(level["label"], level) for level in summary["levels"]]
    if len(rows) != 1:
        rows.append(("all", summary))
    lines = ["  ".join(name.rjust(width) for name, width in _COLUMNS)]
    for label, block in rows:
        cells = (
            label,
            str(block["requests"]["completed"]),
            str(block["requests"]["failed"]),
            _number(block["requests_per_s"], 2),
            _number(block["output_tokens_per_s"], 1),
            f"{_number(block['ttft_ms']['p50'], 1)}/{_number(block['ttft_ms']['p99'], 1)}",
            f"{_number(block['tpot_ms']['p50'], 1)}/{_number(block['tpot_ms']['p99'], 1)}",
            _number(block["itl_ms"]["p50"], 1),
            "-" if block["cached_token_ratio"] is None else f"{block['cached_token_ratio']:.0%}",
            _number(block["goodput_rps"], 2),
        )
        lines.append("  ".join(cell.rjust(width) for cell, (_, width) in zip(cells, _COLUMNS, strict=True)))
    return "\n".join(lines)


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
