"""A fault run on HiCache (issue 16): the node's tier SIGKILLed, then Redis killed, under multi-turn sessions.

    sessions (threads)  ══ turn after turn, shared prefixes ══▶ router ──▶ prefill / decode workers
                                                                              │ NIXL       │
    the node's tier (baton cache) ◀───────────────────────────────────────────┴────────────┘
    redis-server (cluster index) ◀── the tier publishes, the router looks up

    warm-up       turns until the tier holds pages and later turns load from it
    tier kill     SIGKILL `baton cache`; the supervisor restarts it on its port; the workers attach to the
                  new run by themselves: a turn sent after the restart loads from it again
    redis kill    SIGKILL redis-server: `baton_hicache_redis_up` (router, tier) goes 0 and each logs a
                  line; started again on its port: 1 again, the tier writes its index back
    then          every worker's CheckIntegrity until nothing is held

No turn may fail at any point: the tier and Redis are caches, losing them costs only recomputation.
``tier_fault_cluster`` starts the cluster as ``baton serve --host-cache-gib G`` does (its flags, its
worker configs and node tier) with a local redis-server; ``run_tier_faults`` drives it.
"""

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import redis
from grpc_health.v1 import health_pb2_grpc

from deploy.local.launcher import LocalCluster, ManagedCache
from deploy.local.redis_server import RedisServer
from services.engine.model.config_loader import load_model_config

from .leak_check import wait_until_released
from .router_metrics import redis_up
from .sessions import SessionPlan, SessionTraffic
from .tier_fault_report import RedisOutage, TierFaultReport, TierKill
from .worker_kill import serving

_POLL_S = 0.05
INDEX_KEYS = "baton:hicache:node:*:kv"  # common/cluster_index.py: a node tier's KV hashes


@dataclass(frozen=True)
class TierFaultScenario:
    """One HiCache fault run: the sessions, the serving flags that make later turns load from the tier
    (a device pool too small to keep every session's prefix), and the phase bounds.

    Raises:
        ValueError: a value out of range, naming the field.
    """

    sessions: SessionPlan = field(default_factory=SessionPlan)
    block_size: int = 8
    kv_blocks: int = 24  # device blocks per worker: room for the running turns, little more
    max_num_seqs: int = 2  # turns running at once per worker (the others queue)
    host_cache_gib: float = 0.004  # the node's tier: holds every session's prefix
    warm_turns: int = 8  # turns before the tier is killed (and one of them loaded from the tier)
    recovery_timeout_s: float = 60.0  # each wait (restart, a tier hit, a metric) is bounded by this
    leak_bound_s: float = 10.0

    def __post_init__(self):
        context = self.sessions.max_prompt_tokens + self.sessions.max_tokens
        running = self.max_num_seqs * -(-context // self.block_size)
        if self.kv_blocks < running:
            raise ValueError(
                f"kv_blocks: {self.kv_blocks} blocks of {self.block_size} tokens cannot hold "
                f"{self.max_num_seqs} (max_num_seqs) contexts of {context} tokens (max_prompt_tokens + "
                f"max_tokens): {running} blocks"
            )
        for name in ("warm_turns", "max_num_seqs", "recovery_timeout_s", "leak_bound_s", "host_cache_gib"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")

    def serve_flags(self, model: str, redis_url: str) -> list[str]:
        """The ``baton serve`` arguments of this run's cluster."""
        context = self.sessions.max_prompt_tokens + self.sessions.max_tokens
        return [
            *("serve", "--model", model, "--host-cache-gib", repr(self.host_cache_gib)),
            *("--redis-url", redis_url, "--block-size", str(self.block_size)),
            *("--kv-blocks", str(self.kv_blocks), "--max-model-len", str(context)),
            *("--max-num-seqs", str(self.max_num_seqs)),
        ]


@dataclass
class TierFaultCluster:
    """What a run drives: the local cluster (with the node's tier) and the redis-server it uses."""

    local: LocalCluster
    redis: RedisServer

    @property
    def tier(self) -> ManagedCache:
        return self.local.host_cache

    def stop(self) -> None:
        self.local.stop()
        self.redis.stop()


def tier_fault_cluster(
    model: str, scenario: TierFaultScenario, prefill_workers: int = 1, decode_workers: int = 1
) -> TierFaultCluster:
    """A redis-server on a free port and the cluster ``baton serve`` starts for ``scenario.serve_flags``.

    Raises:
        FileNotFoundError: no ``redis-server`` on PATH.
    """
    # Here, not at the top: the CLI's ``bench faults`` imports this package.
    from cli.main import build_parser
    from cli.serve_command import node_cache, worker_configs

    server = RedisServer().start()
    try:
        args = build_parser().parse_args(scenario.serve_flags(model, server.url))
        configs = worker_configs(args, server.url)
        local = LocalCluster(
            model,
            port=0,
            prefill_workers=prefill_workers,
            decode_workers=decode_workers,
            configs=configs,
            host_cache=node_cache(args, configs["decode"]),
            redis_url=server.url,
            ready_timeout_s=scenario.recovery_timeout_s * 2,
        )
    except BaseException:
        server.stop()
        raise
    return TierFaultCluster(local, server)


class LogLines(logging.Handler):
    """Every message logged to ``loggers`` (names) at INFO or above while it is open: the launcher's
    logger carries the lines of the tier and the workers (``[cache] ...``), the others the router's."""

    def __init__(self, loggers: tuple[str, ...]):
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self._loggers = [logging.getLogger(name) for name in loggers]
        self._levels = [logger.level for logger in self._loggers]
        for logger in self._loggers:
            logger.addHandler(self)
            if logger.getEffectiveLevel() > logging.INFO:
                logger.setLevel(logging.INFO)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def matching(self, *words: str) -> list[str]:
        """The lines that contain every one of ``words``."""
        return [line for line in self.lines if all(word in line for word in words)]

    def close(self) -> None:
        for logger, level in zip(self._loggers, self._levels, strict=True):
            logger.removeHandler(self)
            logger.setLevel(level)
        super().close()


def run_tier_faults(cluster: TierFaultCluster, model: str, scenario: TierFaultScenario) -> TierFaultReport:
    """Warm up, kill the tier, kill Redis, under ``scenario.sessions``; then the leak check.

    Raises:
        TimeoutError: the warm-up or a session turn did not finish in time (not a fault finding).
    """
    address = f"127.0.0.1:{cluster.local.port}"
    router_metrics = f"http://127.0.0.1:{cluster.local.router.metrics_port}/metrics"
    logs = LogLines(("deploy.local.launcher", "common.redis_link"))
    started = time.monotonic()
    traffic = SessionTraffic(address, scenario.sessions, load_model_config(model).vocab_size)
    try:

        def warm() -> bool:
            loaded = any(turn.cached_tokens_host > 0 for turn in traffic.since(started))
            return traffic.finished() >= scenario.warm_turns and loaded

        if not _wait(warm, scenario.recovery_timeout_s):
            raise TimeoutError(f"no turn of the first {traffic.finished()} loaded from the tier in time")
        workers = [worker.name for worker in cluster.local.workers]
        tier_kill = _kill_tier(cluster.tier, traffic, logs, workers, scenario.recovery_timeout_s)
        outage = _kill_redis(cluster, router_metrics, scenario.recovery_timeout_s)
    finally:
        outcomes = traffic.stop()
        logs.close()
    leaks = wait_until_released(cluster.local.workers, time.monotonic(), scenario.leak_bound_s)
    return TierFaultReport(
        model=model,
        scenario=scenario,
        outcomes=tuple(outcomes),
        tier_kill=tier_kill,
        redis_outage=outage,
        leaks=leaks,
        worker_lines=tuple(line for line in logs.lines if line.startswith(("[prefill-", "[decode-"))),
        tier_lines=tuple(line for line in logs.lines if line.startswith("[cache]")),
        router_lines=tuple(line for line in logs.lines if line.startswith("redis ")),
        wall_s=time.monotonic() - started,
    )


def _kill_tier(
    tier: ManagedCache, traffic: SessionTraffic, logs: LogLines, workers: list[str], timeout_s: float
) -> TierKill:
    """SIGKILL the tier; wait for the supervisor's restart to serve, then for a turn sent after it that
    loaded from the new run and for every worker's line saying it attached to the new run."""
    process = tier.process
    os.kill(process.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    process.wait(timeout=30)
    with grpc.insecure_channel(tier.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        back = _wait(lambda: tier.process is not process and serving(health), timeout_s)
    restarted = time.monotonic() if back else None
    hit = None
    if restarted is not None:

        def loaded() -> bool:
            return any(turn.cached_tokens_host > 0 for turn in traffic.since(restarted))

        hit = time.monotonic() - killed_at if _wait(loaded, timeout_s) else None

        def reattached() -> list[str]:
            return [name for name in workers if logs.matching(f"[{name}]", "attached to a restarted tier")]

        _wait(lambda: len(reattached()) == len(workers), timeout_s)
    return TierKill(
        workers_reattached=tuple(reattached()) if restarted is not None else (),
        killed_at=killed_at,
        restarted_s=None if restarted is None else restarted - killed_at,
        restarted_at=restarted,
        tier_hit_s=hit,
        restarts=tier.restarts,
    )


def _kill_redis(cluster: TierFaultCluster, router_metrics: str, timeout_s: float) -> RedisOutage:
    """SIGKILL Redis; wait until the router and the tier report it down; start it again on its port; wait
    until both report it up and the tier's index is back in it."""
    tier_metrics = f"http://127.0.0.1:{cluster.tier.ready['metrics_port']}/metrics"
    gauges = {"router": (router_metrics, "router"), "tier": (tier_metrics, "cache")}

    def all_read(value: float) -> Callable[[], bool]:
        return lambda: all(redis_up(url, role) == value for url, role in gauges.values())

    cluster.redis.stop()
    killed_at = time.monotonic()
    down = _wait(all_read(0), timeout_s)
    down_s = time.monotonic() - killed_at if down else None
    cluster.redis.start()
    restarted_at = time.monotonic()
    up = _wait(all_read(1), timeout_s)
    up_s = time.monotonic() - restarted_at if up else None
    client = redis.Redis.from_url(cluster.redis.url, socket_timeout=2)
    try:
        republished = _wait(lambda: bool(client.keys(INDEX_KEYS)), timeout_s)
    finally:
        client.close()
    return RedisOutage(
        killed_at=killed_at,
        reported_down_s=down_s,
        restarted_at=restarted_at,
        reported_up_s=up_s,
        index_republished=republished,
    )


def _wait(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)
    return True
