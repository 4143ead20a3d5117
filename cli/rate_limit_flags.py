"""``--tenant-rate-limit`` and ``--tenant-burst``: the router's per-tenant request rate limit
(``router/tenant_rate_limit.py``), on ``baton router`` and ``baton serve``."""

import argparse


def add_tenant_rate_limit_flags(parser: argparse.ArgumentParser) -> None:
    """Both flags on a command that runs the router."""
    parser.add_argument(
        "--tenant-rate-limit",
        type=float,
        default=0.0,
        metavar="RPS",
        help="Generate requests a second each tenant may send; over it: RESOURCE_EXHAUSTED / HTTP 429 "
        "(default 0: no limit)",
    )
    parser.add_argument(
        "--tenant-burst",
        type=int,
        default=0,
        metavar="N",
        help="requests a tenant may send at once under --tenant-rate-limit (default: the rate rounded up)",
    )
