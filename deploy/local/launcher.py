"""The local cluster: worker processes (supervised, restarted when they die, each started from a
``WorkerConfig`` file) and the router in-process."""

import logging
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import grpc

from common.cluster_secret import read_cluster_secret
from common.internal_tls import insecure_or_internal_channel, internal_tls
from common.rpc.cluster_secret_interceptor import with_cluster_secret
from router.openai.schema import DEFAULT_MAX_N
from router.server import RouterConfig, RouterServer
from services.config_flags import worker_config_from_flags
from services.worker_config import ROLES, WorkerConfig

from .managed_process import OUTPUT_TAIL_LINES, REPO, ManagedCache, ManagedProcess
from .supervisor import Supervisor

log = logging.getLogger(__name__)
__all__ = ["OUTPUT_TAIL_LINES", "REPO", "LocalCluster", "ManagedCache", "ManagedWorker", "role_configs"]


class ManagedWorker(ManagedProcess):
    """One worker subprocess, started from ``config`` (written to a ``--config`` file for each start);
    ``port`` stays the same across restarts so the router's address holds. The worker's environment has
    no ``BATON_WORKER_*`` variables: its file is the whole config.
    """

    def __init__(self, config: WorkerConfig, port: int = 0):
        super().__init__(port or config.port)
        self.config = config
        self.internal_tls = internal_tls(
            config.internal_tls_cert, config.internal_tls_key, config.internal_tls_ca
        )

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

    def channel(self) -> grpc.Channel:
        """A channel to the worker that sends its cluster secret (``config.cluster_secret_file``) on
        every call, over its internal TLS if it has one; the caller closes it."""
        file = self.config.cluster_secret_file
        return with_cluster_secret(
            insecure_or_internal_channel(self.address, self.internal_tls),
            read_cluster_secret(file) if file else "",
        )

    def start(self, ready_timeout_s: float) -> None:
        with tempfile.NamedTemporaryFile(
            "w", prefix=f"baton-{self.name}-", suffix=".yaml", delete=False
        ) as file:
            file.write(replace(self.config, port=self.port).to_yaml())
        self._config_file = file.name
        try:
            super().start(ready_timeout_s)
        finally:
            os.unlink(file.name)  # read before READY (or never: the worker failed)

    def argv(self) -> list[str]:
        # --name again (the file has it): `ps` tells the workers apart; --exit-with-parent: if the
        # launcher is killed outright, its workers go with it.
        return ["worker", "--config", self._config_file, "--name", self.name, "--exit-with-parent"]


class LocalCluster:
    """``prefill_workers`` + ``decode_workers`` worker processes and a router on ``port`` (and an
    OpenAI-compatible HTTP front on ``http_port`` when given). With ``disaggregation="never"``
    (colocated) there are no prefill workers: decode workers prefill every prompt themselves.

    Each role's workers start from one ``WorkerConfig``: ``configs`` (``{"prefill": ..., "decode":
    ...}``, what ``baton serve`` builds; names and ports are set per worker), or else ``baton worker``
    flags, ``worker_args`` for every worker plus ``role_args[role]`` (e.g. ``{"decode": ["--device",
    "cuda:1"]}``) with ``model`` and ``grace_period_s``, checked here before anything starts.

    ``host_cache``: the node's HiCache tier (``baton cache``), started first; every worker's
    ``engine.host_cache_address`` is set to it. None: workers without a node tier. ``redis_url``: the
    router's HiCache cluster index ("": none); the workers' (and the tier's) is in their configs.
    ``auth_token_file``: the router's ``--auth-token-file`` ("": the public API needs no token).
    ``tls_cert``, ``tls_key``, ``tls_client_ca``: the router's ``--tls-*`` files ("": plaintext ports);
    the workers' ports stay as they are. ``cluster_secret_file``: the cluster secret every worker and
    the tier then require on their internal calls and the router and workers send ("": none; ``baton
    serve`` always gives one); it is set on ``host_cache`` too. ``internal_tls_files``: ``(cert, key,
    CA)`` of the internal mutual TLS every process then serves and calls with (``common/internal_tls.py``;
    empty: plaintext). ``tenant_rate_limit``, ``tenant_burst``: the router's per-tenant request rate
    limit (0: none). ``max_n``: the OpenAI front's largest ``n`` (``--max-n``).

    A worker (or the tier) that exits is reported and restarted on its port; the router keeps serving
    through the others meanwhile (and without the tier: its clients answer misses, then attach to the
    new run). SIGTERM on a worker drains it first (its ``grace_period_s``): a rolling restart, one worker
    after the other, loses no request. ``stop()`` ends everything. Workers start, and stop, all at the
    same time (after the tier starts, before it stops).
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
        host_cache: ManagedCache | None = None,
        redis_url: str = "",
        auth_token_file: str = "",
        tls_cert: str = "",
        tls_key: str = "",
        tls_client_ca: str = "",
        cluster_secret_file: str = "",
        tenant_rate_limit: float = 0.0,
        tenant_burst: int = 0,
        max_n: int = DEFAULT_MAX_N,
        internal_tls_files: tuple[str, str, str] = ("", "", ""),
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
        if cluster_secret_file:
            read_cluster_secret(cluster_secret_file)  # a bad file fails here, before anything starts
            configs = {
                role: replace(config, cluster_secret_file=cluster_secret_file)
                for role, config in configs.items()
            }
            if host_cache is not None:
                host_cache.cluster_secret_file = cluster_secret_file
        tls = dict(
            zip(("internal_tls_cert", "internal_tls_key", "internal_tls_ca"), internal_tls_files, strict=True)
        )
        if internal_tls(*internal_tls_files) is not None:  # bad files fail here, before anything starts
            configs = {role: replace(config, **tls) for role, config in configs.items()}
            if host_cache is not None:
                host_cache.use_internal_tls(internal_tls_files)
        self.host_cache = host_cache
        self.workers: list[ManagedWorker] = []
        self._supervisor: Supervisor | None = None
        self.router = None
        try:
            if host_cache is not None:  # first: the workers are given its address
                host_cache.start(ready_timeout_s)
                configs = {
                    role: with_host_cache(config, host_cache.address) for role, config in configs.items()
                }
            self.workers = [
                ManagedWorker(replace(configs[role], name=f"{role}-{i}", port=0))
                for role, count in (("prefill", prefill_workers), ("decode", decode_workers))
                for i in range(count)
            ]
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
                    auth_token_file=auth_token_file,
                    tls_cert=tls_cert,
                    tls_key=tls_key,
                    tls_client_ca=tls_client_ca,
                    cluster_secret_file=cluster_secret_file,
                    **tls,
                    tenant_rate_limit=tenant_rate_limit,
                    tenant_burst=tenant_burst,
                    max_n=max_n,
                    # the router refuses what no worker could take (--max-model-len reaches both)
                    max_model_len=min(w.config.engine.max_model_len for w in self.workers),
                    prefill=tuple(w.address for w in self.workers if w.role == "prefill"),
                    decode=tuple(w.address for w in self.workers if w.role == "decode"),
                )
            )
        except Exception:
            self.stop()
            raise
        self._supervisor = Supervisor(self.processes, ready_timeout_s)
        self._supervisor.start()

    @property
    def port(self) -> int:
        return self.router.port

    @property
    def processes(self) -> list[ManagedProcess]:
        """What the supervisor restarts: the node's tier (when there is one), then the workers."""
        return [*filter(None, [self.host_cache]), *self.workers]

    def stop(self) -> None:
        """Stop the router, the workers (each drains), then the tier."""
        if self._supervisor is not None:
            self._supervisor.stop()
        if self.router is not None:
            self.router.stop()
        if self.workers:
            with ThreadPoolExecutor(max_workers=len(self.workers)) as pool:
                list(pool.map(ManagedWorker.stop, self.workers))  # each drains its grace period at once
        if self.host_cache is not None:  # last: the workers' final saves went to it
            self.host_cache.stop()


def with_host_cache(config: WorkerConfig, address: str) -> WorkerConfig:
    """``config`` whose engine uses the node's tier at ``address`` instead of one of its own."""
    return replace(config, engine=replace(config.engine, host_cache_address=address, host_cache_gib=0.0))


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
