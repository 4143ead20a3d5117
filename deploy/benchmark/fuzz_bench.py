"""``baton bench fuzz``: thousands of bad requests against a router, then one good one.

The cluster is the caller's (``--target`` for gRPC, ``--http-target`` for HTTP) or one started
here (router with its OpenAI front, one prefill and one decode worker, on a tiny checkpoint).
Cases come from ``fuzz_cases.make_case`` with a seeded generator, so a seed replays a run; they are
sent one at a time, and the report (``FuzzReport``) counts answers and findings.
"""

import ipaddress
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from deploy.local.launcher import LocalCluster

from .fuzz_cases import make_case
from .fuzz_client import FuzzClient
from .fuzz_report import FuzzReport

# Workers of a started cluster stop every generation at this length, so a fuzzed max_tokens costs
# at most a few hundred milliseconds; longer prompts are refused, which is one more path exercised.
FUZZ_MAX_MODEL_LEN = 128


def run_fuzz(
    client: FuzzClient, cases: int, seed: int, progress: Callable[[int], None] | None = None
) -> FuzzReport:
    """Send ``cases`` cases (those of a surface ``client`` has no target for are skipped, not
    counted), then a normal request on each surface (``report.serving``)."""
    if cases < 1:
        raise ValueError(f"--cases: must be >= 1, got {cases}")
    rng, report = random.Random(seed), FuzzReport(seed)
    started = time.monotonic()
    while report.cases < cases:
        case = make_case(rng)
        if client.serves(case):
            report.add(case, client.run(case))
            if progress is not None and report.cases % 1000 == 0:
                progress(report.cases)
    report.seconds = time.monotonic() - started
    report.serving = client.check_serving()
    return report


def check_target(target: str | None, flag: str, allow_remote: bool) -> None:
    """Refuse a ``host:port`` that is malformed, or not on loopback unless ``allow_remote``: fuzzing
    sends a remote server thousands of hostile requests, which must be a deliberate choice."""
    if target is None:
        return
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{flag}: expected host:port, got {target!r}")
    if allow_remote:
        return
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"{flag}: {host} is not a loopback address; add --allow-remote to fuzz it")


@contextmanager
def fuzz_cluster(model: str, worker_args: tuple[str, ...] = ()) -> Iterator[LocalCluster]:
    """A local cluster for fuzzing: router (gRPC and HTTP on free ports), one prefill and one
    decode worker whose ``--max-model-len`` is ``FUZZ_MAX_MODEL_LEN``."""
    cluster = LocalCluster(
        model,
        port=0,
        prefill_workers=1,
        decode_workers=1,
        worker_args=["--max-model-len", str(FUZZ_MAX_MODEL_LEN), *worker_args],
        http_port=0,
    )
    try:
        yield cluster
    finally:
        cluster.stop()
