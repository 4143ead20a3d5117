"""``ManagedProcess``: one supervised service subprocess of the local cluster (a worker, the node's
``baton cache``), started by a command that prints ``READY ... port=N`` and serves gRPC health there,
restarted on the same port when it dies."""

import logging
import os
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.internal_tls import FLAGS, InternalTls, insecure_or_internal_channel, internal_tls
from services.worker_config import ENV_PREFIX

log = logging.getLogger("deploy.local.launcher")  # one logger for the cluster's lines (baton serve's log)
REPO = Path(__file__).resolve().parents[2]
OUTPUT_TAIL_LINES = 50  # a process's last lines kept in memory, for the error when it fails to start


class ManagedProcess:
    """A ``python -m cli.main ...`` subprocess; subclasses give ``name``, ``grace_period_s`` and ``argv()``.

    Every line the process prints goes to the cluster's logger as ``[name] line``; ``output`` keeps only
    the last ``OUTPUT_TAIL_LINES``. Its environment has no ``BATON_WORKER_*`` variables (a worker's file is
    its whole config). ``port`` (0: any free one, learnt from the READY line) stays the same across
    restarts, so the addresses handed out hold.
    """

    name: str
    grace_period_s: float
    restart_wave: int = 1  # the supervisor restarts lower waves first (the tier before its workers)
    internal_tls: InternalTls | None = None  # its port's internal mutual TLS (the probe uses it too)

    def __init__(self, port: int = 0):
        self.port = port
        self.process: subprocess.Popen | None = None
        self.restarts = 0
        self.output: deque = deque(maxlen=OUTPUT_TAIL_LINES)
        self.ready: dict[str, str] = {}  # the last READY line's fields (port, metrics_port, ...)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        """The ``cli.main`` arguments of one start (called at each start, with ``port`` as it is then)."""
        raise NotImplementedError

    def start(self, ready_timeout_s: float) -> None:
        """Start the process and wait until it is READY and its health service says SERVING.

        Raises:
            RuntimeError: it exited or did not become ready in time (with its last lines).
        """
        search_path = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
        env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
        env.update(PYTHONUNBUFFERED="1", PYTHONPATH=search_path)
        # Own session: a terminal's Ctrl-C reaches the launcher only, which stops the processes in order.
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", *self.argv()],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        if self._wait_ready(ready_timeout_s):
            return
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
                self.ready = dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
                self.port = int(self.ready["port"])
                threading.Thread(target=self._drain, name=f"{self.name}-output", daemon=True).start()
                return _serving(self.address, deadline, self.internal_tls)
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
        """SIGTERM (a worker drains for up to its grace period), then SIGKILL if it hangs."""
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout=self.grace_period_s + 15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)


def _serving(address: str, deadline: float, tls: InternalTls | None) -> bool:
    """Whether the process's gRPC health service says SERVING before ``deadline`` (over ``tls``)."""
    with insecure_or_internal_channel(address, tls) as channel:
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


class ManagedCache(ManagedProcess):
    """The node's ``baton cache`` (the HiCache host tier): ``kv_gib`` / ``kda_gib`` of host memory,
    publishing what it holds to the cluster index at ``redis_url`` as ``node`` ("": not / the host name),
    with an L3 of ``l3_gib`` there below it (0: none), its pages in shared-memory files in ``shm_dir``
    (``None``: the command's default, ``/dev/shm``; "": private, reached over NIXL only), each tenant
    keeping ``tenant_reserve_pages`` pages against other tenants' puts (0: none); every call to it must
    carry the secret in ``cluster_secret_file`` ("": none needed).

    Its pages live only in its memory: a restart starts an empty tier, and the workers' clients attach to
    it again by themselves (``services/hicache/client.py``).
    """

    name = "cache"
    grace_period_s = 0.0
    restart_wave = 0  # ready before the workers that attach to it come back

    def __init__(
        self,
        kv_gib: float,
        kda_gib: float,
        port: int = 0,
        redis_url: str = "",
        node: str = "",
        l3_gib: float = 0.0,
        shm_dir: str | None = None,
        cluster_secret_file: str = "",
        tenant_reserve_pages: int = 0,
    ):
        super().__init__(port)
        self.tenant_reserve_pages = tenant_reserve_pages
        self.cluster_secret_file = cluster_secret_file
        self.l3_gib = l3_gib
        self.shm_dir = shm_dir
        self.kv_gib = kv_gib
        self.kda_gib = kda_gib
        self.redis_url = redis_url
        self.node = node

    def use_internal_tls(self, files: tuple[str, str, str]) -> None:
        """Serve (and be probed) over internal mutual TLS from ``(cert, key, CA)`` files."""
        self.internal_tls = internal_tls(*files)

    def argv(self) -> list[str]:
        sizes = ["--kv-gib", repr(self.kv_gib), "--kda-gib", repr(self.kda_gib)]
        index = [
            *(["--redis-url", self.redis_url] if self.redis_url else []),
            *(["--node", self.node] if self.node else []),
            *(["--redis-l3-gib", repr(self.l3_gib)] if self.l3_gib and self.redis_url else []),
        ]
        if self.shm_dir is not None:
            index += ["--shm-dir", self.shm_dir]
        if self.tenant_reserve_pages:
            index += ["--tenant-cache-reserve-pages", str(self.tenant_reserve_pages)]
        if self.cluster_secret_file:
            index += ["--cluster-secret-file", self.cluster_secret_file]
        if self.internal_tls is not None:
            index += [
                part
                for flag, path in zip(FLAGS, self.internal_tls.files, strict=True)
                for part in (flag, path)
            ]
        return ["cache", "--port", str(self.port), *sizes, *index, "--exit-with-parent"]
