"""``baton bench trust``: what the bearer token, the cluster secret and the handoff checksum cost, side
by side in one run: time to first token of an open and a trusted cluster, and the checksum's time beside
the handoff's write (``deploy/benchmark/trust_cost.py``)."""

import argparse
import json
from dataclasses import replace

from common.byte_sizes import parse_sizes
from deploy.benchmark.trust_cost import measure_trust_cost

from .arguments import DTYPES
from .bench_model import add_model_flags, bench_model


def register_trust(kinds: argparse._SubParsersAction) -> None:
    """Add ``trust`` to the ``bench`` subcommands."""
    bench = kinds.add_parser(
        "trust", help="cost of auth + the handoff checksum: TTFT open vs trusted, checksum vs transfer"
    )
    add_model_flags(bench)
    bench.add_argument("--device", default="cpu", help="the workers' device: cpu or cuda[:N] (default cpu)")
    bench.add_argument("--dtype", choices=DTYPES, help="the workers' model dtype (default: the worker's)")
    bench.add_argument("--requests", type=int, default=40, help="timed requests per arm (default 40)")
    bench.add_argument("--warmup", type=int, default=4, help="untimed requests per arm first (default 4)")
    bench.add_argument("--prompt-tokens", type=int, default=256, help="prompt length (default 256)")
    bench.add_argument(
        "--sizes", default="1M,16M,64M", help="handoff sizes for the data-plane rows (default 1M,16M,64M)"
    )
    bench.add_argument(
        "--links-gbps",
        default="50,450",
        help="links (GB/s) to put the checksum beside, besides this host's write (default 50,450: a 400 Gb/s "
        "NIC, NVLink one way)",
    )
    bench.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    bench.set_defaults(run=run_trust)


def run_trust(args: argparse.Namespace) -> int:
    sizes = parse_sizes(args.sizes, "--sizes")
    try:
        links = tuple(float(part) for part in args.links_gbps.split(","))
    except ValueError:
        raise ValueError(
            f"--links-gbps: expected comma-separated GB/s like 50,450, got {args.links_gbps!r}"
        ) from None
    worker_args = ("--dtype", args.dtype) if args.dtype else ()
    with bench_model(args) as (model, name):
        report = measure_trust_cost(
            model,
            requests=args.requests,
            warmup=args.warmup,
            prompt_tokens=args.prompt_tokens,
            sizes_bytes=tuple(sizes),
            device=args.device,
            worker_args=worker_args,
            links_gbps=links,
        )
    report = replace(report, model=name)
    print(json.dumps(report.as_dict()) if args.json else report.format_table())
    return 0
