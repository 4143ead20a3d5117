"""The local cluster: worker processes (supervised, restarted when they die, each started from a
``WorkerConfig`` file) and the router in-process."""

import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from router.server import RouterConfig, RouterServer
from services.config_flags import worker_config_from_flags
from services.worker_config import ENV_PREFIX, ROLES, WorkerConfig

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
OUTPUT_TAIL_LINES = 50  # a worker's last lines kept in memory, for the error when it fails to start


@dataclass
class ManagedWorker:
    """One worker subprocess, started from ``config`` (written to a ``--config`` file for each start);
    ``port`` stays the same across restarts so the router's address holds.

    Every line the worker prints goes to this module's logger as ``[name] line`` (so to ``baton
    serve``'s log); ``output`` keeps only the last ``OUTPUT_TAIL_LINES`` of them. The worker's
    environment has no ``BATON_WORKER_*`` variables: its file is the whole config.
    """

    config: WorkerConfig
    port: int = 0
    process: subprocess.Popen | None = None
    restarts: int = 0
    output: deque = field(default_factory=lambda: deque(maxlen=OUTPUT_TAIL_LINES))

    def __post_init__(self):
        self.port = self.port or self.config.port

    @property
    def role(self) -> str:
        return self.config.role

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def grace_period_s(self) -> float:
        """The worker's ``grace_period_s`` (how long it drains after SIGTERM)."""
        return self.config.grace_period_s

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, ready_timeout_s: float) -> None:
        search_path = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
        env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
        env.update(PYTHONUNBUFFERED="1", PYTHONPATH=search_path)
        with tempfile.NamedTemporaryFile(
            "w", prefix=f"baton-{self.name}-", suffix=".yaml", delete=False
        ) as file:
            file.write(replace(self.config, port=self.port).to_yaml())
        # Own session: a terminal's Ctrl-C reaches the launcher only, which stops workers in order;
        # --exit-with-parent: if the launcher is killed outright, its workers go with it.
        try:
            self.process = subprocess.Popen(
                # --name again (the file has it): `ps` tells the workers apart.
                [sys.executable, "-m", "cli.main", "worker", "--config", file.name, "--name", self.name]
                + ["--exit-with-parent"],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            if self._wait_ready(ready_timeout_s):
                return
        finally:
            os.unlink(file.name)  # read before READY (or never: the worker failed)
        self.stop()
        raise RuntimeError(f"{self.name} did not become ready:\n{''.join(self.output)}")

    def _wait_ready(self, ready_timeout_s: float) -> bool:
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                return False
            self._record(line)
            if line.startswith("READY "):
                self.port = int(line.rsplit("port=", 1)[1])
                threading.Thread(target=self._drain, name=f"{self.name}-output", daemon=True).start()
                return _serving(self.address, deadline)
        return False

    def _drain(self) -> None:
        for line in self.process.stdout:
            self._record(line)

    def _record(self, line: str) -> None:
        self.output.append(line)
        log.info("[%s] %s", self.name, line.rstrip("\n"))

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """SIGTERM (the worker drains for up to its grace period), then SIGKILL if it hangs."""
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=self.grace_period_s + 15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)


def _serving(address: str, deadline: float) -> bool:
    """Whether the worker's gRPC health service says SERVING before ``deadline``."""
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                reply = health.Check(health_pb2.HealthCheckRequest(), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                pass  # not listening yet
            time.sleep(0.1)
    return False


class LocalCluster:
    """``prefill_workers`` + ``decode_workers`` worker processes and a router on ``port`` (and an
    OpenAI-compatible HTTP front on ``http_port`` when given). With ``disaggregation="never"``
    (colocated) there are no prefill workers: decode workers prefill every prompt themselves.

    Each role's workers start from one ``WorkerConfig``: ``configs`` (``{"prefill": ..., "decode":
    ...}``, what ``baton serve`` builds; names and ports are set per worker), or else ``baton worker``
    flags, ``worker_args`` for every worker plus ``role_args[role]`` (e.g. ``{"decode": ["--device",
    "cuda:1"]}``) with ``model`` and ``grace_period_s``, checked here before anything starts.

    ``redis_url``: the router's HiCache cluster index ("": none); the workers' is in their configs.

    A worker that exits is reported and restarted on its port; the router keeps serving through the
    others meanwhile. SIGTERM on a worker drains it first (its ``grace_period_s``): a rolling restart,
    one worker after the other, loses no request. ``stop()`` ends everything.
    Workers start, and stop, all at the same time.
    """

    def __init__(
        self,
        model: str,
        port: int,
        prefill_workers: int,
        decode_workers: int,
        worker_args: list[str] = (),
        ready_timeout_s: float = 300.0,
        metrics_port: int = 0,
        http_port: int | None = None,
        disaggregation: str = "conditional",
        local_prefill_tokens: int = 16,
        slo_ttft_s: float = 2.0,
        slo_tpot_s: float = 0.1,
        role_args: dict[str, list[str]] | None = None,
        grace_period_s: float = 30.0,
        configs: dict[str, WorkerConfig] | None = None,
        redis_url: str = "",
    ):
        if not grace_period_s >= 0:
            raise ValueError(f"--grace-period: must be >= 0, got {grace_period_s}")
        if decode_workers < 1:
            raise ValueError("--decode-workers: need at least one")
        if disaggregation == "never":
            prefill_workers = 0  # colocated: decode workers prefill everything themselves
        elif prefill_workers < 1:
            raise ValueError("--prefill-workers: need at least one (or --colocated)")
        self.ready_timeout_s = ready_timeout_s
        if configs is None:
            configs = role_configs(model, worker_args, role_args or {}, grace_period_s)
        elif worker_args or role_args:
            raise ValueError("worker_args, role_args: give either these or configs")
        self.workers = [
            ManagedWorker(replace(configs[role], name=f"{role}-{i}", port=0))
            for role, count in (("prefill", prefill_workers), ("decode", decode_workers))
            for i in range(count)
        ]
        self._stop = threading.Event()
        self.router = None
        try:
            # All at once: each worker pays its imports and model load while the others do.
            with ThreadPoolExecutor(max_workers=len(self.workers)) as pool:
                for started in [pool.submit(worker.start, ready_timeout_s) for worker in self.workers]:
                    started.result()  # the first worker that failed to start, raised here
            self.router = RouterServer(
                RouterConfig(
                    model=model,
                    port=port,
                    metrics_port=metrics_port,
                    http_port=http_port,
                    disaggregation=disaggregation,
                    local_prefill_tokens=local_prefill_tokens,
                    slo_ttft_s=slo_ttft_s,
                    slo_tpot_s=slo_tpot_s,
                    redis_url=redis_url,
                    prefill=tuple(w.address for w in self.workers if w.role == "prefill"),
                    decode=tuple(w.address for w in self.workers if w.role == "decode"),
                )
            )
        except Exception:
            self.stop()
            raise
        self._supervisor = threading.Thread(target=self._supervise, name="supervisor", daemon=True)
        self._supervisor.start()

    @property
    def port(self) -> int:
        return self.router.port

    def _supervise(self) -> None:
        while not self._stop.wait(0.5):
            for worker in self.workers:
                if not worker.alive() and not self._stop.is_set():
                    code = worker.process.poll() if worker.process else None
                    level = logging.INFO if code == 0 else logging.ERROR  # 0: drained after SIGTERM
                    log.log(
                        level, "%s exited (code %s); restarting it on port %d", worker.name, code, worker.port
                    )
                    worker.restarts += 1
                    try:
                        worker.start(self.ready_timeout_s)
                    except RuntimeError as error:
                        log.error("%s", error)

    def stop(self) -> None:
        self._stop.set()
        if self.router is not None:
            self.router.stop()
        with ThreadPoolExecutor(max_workers=len(self.workers)) as pool:
            list(pool.map(ManagedWorker.stop, self.workers))  # each drains its grace period at once


def role_configs(
    model: str, worker_args: list[str], role_args: dict[str, list[str]], grace_period_s: float = 30.0
) -> dict[str, WorkerConfig]:
    """``{role: WorkerConfig}`` from ``baton worker`` flags: ``worker_args`` + ``role_args[role]``.

    Raises:
        ValueError: an unknown role in ``role_args``, or a flag or value the worker would refuse.
    """
    unknown = set(role_args) - set(ROLES)
    if unknown:
        raise ValueError(f"role_args: unknown roles {sorted(unknown)} (prefill, decode)")
    common = ["--model", model, "--grace-period", str(grace_period_s), *worker_args]
    return {
        role: worker_config_from_flags(["--role", role, *common, *role_args.get(role, [])]) for role in ROLES
    }
