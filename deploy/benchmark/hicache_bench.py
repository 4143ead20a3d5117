"""Trace replays with the node's host tier and without it: issue 16's later-turn TTFT and prefill
tokens computed, side by side.

For each trace and cluster mode, two clusters are started in turn through ``LocalCluster`` (what
``baton serve`` runs), with the same workers and the same device pool (``--kv-blocks``: a share of the
replay's working set, ``hicache_workload``): one with a node tier (``baton cache``, large enough for the
whole working set, every worker attached to it) and one without. Each replays the same requests through
``baton loadtest``'s runner (one-turn sessions in arrival order, ``--concurrency`` at a time), after a
warm-up of unrelated prompts, and reads the router's counters around the replay::

    trace -> ReplayPlan (requests, later turns, working set) -> pool = share x working set
      mode disaggregated: [no tier] cluster P+D -> replay      [tier] cache + cluster P+D -> replay
      mode colocated:     [no tier] cluster 2 D -> replay      [tier] cache + cluster 2 D -> replay
"""

import math
from dataclasses import dataclass, field

import torch

from deploy.local.launcher import LocalCluster, ManagedCache
from loadtest.clients.target import parse_target
from loadtest.drivers import Limits
from loadtest.metrics import Slo
from loadtest.runner import RunPlan, run_plan
from loadtest.workload import Workload
from loadtest.workloads import load_trace, synthetic, trace_format
from services.engine.cache.layout import block_layout, slot_layout
from services.engine.model.config_loader import load_model_config

from .hicache_report import ArmResult, Comparison, arm_result
from .hicache_workload import ReplayPlan, replay_plan
from .worker_threads import worker_threads as torch_threads

MODES = ("disaggregated", "colocated")
GIB = 1 << 30
VOCAB = 1000  # prompt ids lie in [16, 1000): inside every preset's vocabulary, below its special tokens
_WARMUP_TOKENS = 64


@dataclass(frozen=True)
class HicacheSetup:
    """How every cluster of the benchmark runs.

    Attributes:
        scale: trace token divisor (``loadtest.workloads.scale``).
        requests: the first this many requests of each trace (None: all).
        copies: WEKA traces: sessions of each file, salted apart, taking turns (``hicache_workload``).
        multi_turn_only: Mooncake traces: only the requests of conversations with a later turn, from
            the first ``max(10 x requests, 2000)`` lines.
        max_tokens: generated tokens per request at most (None: the trace's, scaled).
        block_size: the workers' ``--block-size``.
        pool_share: the device pool as a share of the working set (at least the longest request).
        snapshot_stride: the workers' ``--snapshot-stride`` (KDA snapshots every this many blocks).
        concurrency: requests in flight at once.
        tier_margin: the tier holds this many times what the replay can put into it.
        slo: goodput's targets.
        worker_args: more ``baton worker`` flags for every worker (``--device``, ``--dtype``, ...).
        dtype: the workers' model dtype (sizes the tier's pages); None: the checkpoint's.
        workers: worker processes per cluster (disaggregated: one prefill, the rest decode).
        timeout_s: each request's deadline.
    """

    scale: int = 32
    requests: int | None = 120
    copies: int = 8
    multi_turn_only: bool = True
    max_tokens: int | None = 4
    block_size: int = 16
    pool_share: float = 0.1
    snapshot_stride: int = 4
    concurrency: int = 1
    tier_margin: float = 2.0
    slo: Slo = field(default_factory=lambda: Slo(ttft_s=2.0, tpot_s=0.1))
    worker_args: tuple[str, ...] = ()
    dtype: str | None = None
    workers: int = 2
    timeout_s: float = 600.0

    def __post_init__(self):
        checks = (
            ("--scale", self.scale >= 1, "must be >= 1"),
            ("--block-size", self.block_size >= 1, "must be >= 1"),
            ("--snapshot-stride", self.snapshot_stride >= 1, "must be >= 1"),
            ("--concurrency", self.concurrency >= 1, "must be >= 1"),
            ("--workers", self.workers >= 2, "must be >= 2 (a prefill and a decode worker)"),
            ("--pool-share", 0 < self.pool_share <= 1, "must be in (0, 1]"),
        )
        for flag, ok, wording in checks:
            if not ok:
                raise ValueError(f"{flag}: {wording}")


def measure_hicache(
    model: str,
    traces: list[str],
    modes: tuple[str, ...],
    setup: HicacheSetup,
    progress=print,
    on_comparison=lambda comparison: None,
) -> list[Comparison]:
    """Replay each trace on each mode's clusters, without the tier and with it.

    Args:
        model: checkpoint folder.
        traces: trace files (a Mooncake ``.jsonl`` or a WEKA ``.json`` each).
        modes: from ``MODES``.
        setup: see ``HicacheSetup``.
        progress: called with a line as each arm starts.
        on_comparison: called with each ``Comparison`` as soon as both its arms ran.

    Raises:
        ValueError: a bad argument, naming its flag.
    """
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown or not modes:
        raise ValueError(f"--modes: expected some of {', '.join(MODES)}, got {','.join(modes)!r}")
    config = load_model_config(model)
    plans = [load_replay(trace, setup) for trace in traces]  # every trace read before any cluster starts
    comparisons = []
    for plan in plans:
        workload = plan.workload
        kv_gib, kda_gib = tier_size(config, plan, setup)
        for mode in modes:
            arms = {}
            for tier in (False, True):
                progress(
                    f"{workload.name}, {mode}, {'tier' if tier else 'no tier'}: {len(plan.later)} requests"
                )
                arms[tier] = run_arm(model, plan, mode, setup, (kv_gib, kda_gib) if tier else None)
            comparison = Comparison(
                workload.name,
                mode,
                plan.working_set_blocks,
                plan.pool_blocks(setup.pool_share),
                kv_gib + kda_gib,
                arms[False],
                arms[True],
            )
            on_comparison(comparison)
            comparisons.append(comparison)
    return comparisons


def load_replay(trace: str, setup: HicacheSetup) -> ReplayPlan:
    """The replay of ``trace``: a Mooncake ``.jsonl``, or WEKA ``.json`` files (comma-separated: one
    replay of them all, in ``setup.copies`` copies).

    Raises:
        ValueError: an unreadable or unknown trace, naming the file.
    """
    paths = [part.strip() for part in str(trace).split(",") if part.strip()]
    if not paths:
        raise ValueError(f"--trace: expected a trace file, got {trace!r}")
    if all(trace_format(path) == "weka" for path in paths):
        workload = load_trace(paths, VOCAB, setup.scale, copies=setup.copies)
        return replay_plan(workload, setup.requests, setup.block_size, max_tokens=setup.max_tokens)
    if len(paths) > 1:
        raise ValueError(f"--trace: give one Mooncake .jsonl per --trace, got {trace!r}")
    multi = setup.multi_turn_only
    # Mooncake's first later turn is line 133: read at least 2000 lines when choosing conversations.
    lines = None if setup.requests is None else (max(10 * setup.requests, 2000) if multi else setup.requests)
    workload = load_trace(paths[0], VOCAB, setup.scale, max_requests=lines)
    return replay_plan(workload, setup.requests, setup.block_size, multi, setup.max_tokens)


def tier_size(config, plan: ReplayPlan, setup: HicacheSetup) -> tuple[float, float]:
    """``(kv_gib, kda_gib)``: pages for every block the replay can write (its prompts' blocks and the
    generated ones) and a snapshot per stride, prompt end and turn end, times ``tier_margin``."""
    dtype = getattr(torch, setup.dtype or config.torch_dtype)
    block_bytes = block_layout(config, setup.block_size, dtype).nbytes
    slot_bytes = slot_layout(config, dtype).nbytes if config.kda is not None else 0
    requests = len(plan.later)
    generated = sum(s.turns[0].max_tokens for s in plan.workload.sessions)
    kv_pages = plan.working_set_blocks + -(-generated // setup.block_size) + requests
    kda_pages = plan.working_set_blocks // setup.snapshot_stride + 3 * requests
    kv = kv_pages * block_bytes * setup.tier_margin / GIB
    kda = kda_pages * slot_bytes * setup.tier_margin / GIB
    return kv, kda


def run_arm(
    model: str, plan: ReplayPlan, mode: str, setup: HicacheSetup, tier: tuple[float, float] | None
) -> ArmResult:
    """One cluster (with a node tier of ``(kv_gib, kda_gib)``, or none), warmed up, replaying ``plan``."""
    worker_args = [
        "--kv-blocks",
        str(plan.pool_blocks(setup.pool_share)),
        "--block-size",
        str(setup.block_size),
        "--snapshot-stride",
        str(setup.snapshot_stride),
        "--max-model-len",
        str(plan.longest_tokens + setup.block_size),
        *(["--dtype", setup.dtype] if setup.dtype else []),
        *setup.worker_args,
    ]
    disaggregated = mode == "disaggregated"
    with torch_threads(1):  # restarts too: a worker process per core at most on a small machine
        cluster = LocalCluster(
            model,
            port=0,
            prefill_workers=1 if disaggregated else 0,
            decode_workers=setup.workers - 1 if disaggregated else setup.workers,
            worker_args=worker_args,
            disaggregation="conditional" if disaggregated else "never",
            host_cache=None if tier is None else ManagedCache(*tier),
        )
        try:
            target = parse_target(f"grpc://127.0.0.1:{cluster.port}", explicit=True)
            _replay(target, _warmup(setup.workers), None, setup)
            metrics = f"http://127.0.0.1:{cluster.router.metrics_port}/metrics"
            outcome = _replay(target, plan.workload, metrics, setup)
        finally:
            cluster.stop()
    return arm_result(
        tier is not None,
        outcome.result.records,
        plan.later,
        outcome.server,
        outcome.result.measured_s,
        setup.slo,
    )


def _replay(target, workload: Workload, metrics_url: str | None, setup: HicacheSetup):
    plan = RunPlan(
        target=target,
        levels=(setup.concurrency,),
        limits=Limits(time_scale=math.inf),
        metrics_url=metrics_url,
        request_timeout_s=setup.timeout_s,
        progress=False,
    )
    return run_plan(plan, workload)


def _warmup(workers: int) -> Workload:
    """Unrelated prompts, two per worker, so no replayed request pays a worker's first-step costs."""
    return synthetic(2 * workers, _WARMUP_TOKENS, 4, 0.0, VOCAB, seed=12345)
