"""Starts the router: the public ``Generation`` gRPC service over a pool of workers."""

import shutil
import tempfile
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from common.cluster_index import ClusterIndex
from common.cluster_secret import read_cluster_secret
from common.internal_tls import InternalTls, internal_tls
from common.metrics import Metrics
from common.model_info import STATEFUL_FAMILIES, read_model_info
from common.redis_link import check_redis_url
from common.rpc.errors import ErrorInterceptor
from common.tokenizer import Tokenizer, TokenizerNotFoundError
from proto.baton.v1 import generation_pb2_grpc

from .admission import Admission
from .auth_interceptor import AuthInterceptor
from .auth_tokens import TokenTable
from .authentication import REASONS, Authenticator
from .discovery import Discovery, discovery_for
from .dispatch import Dispatcher
from .migration import Migrator
from .openai import OpenAIFront
from .servicer import GenerationServicer
from .tenant_rate_limit import TenantRateLimit, from_flags
from .tls import server_tls
from .tls_reload import ReloadingTls
from .worker_pool import WorkerPool


@dataclass(frozen=True)
class RouterConfig:
    """The router process: the model it fronts, its workers, where it listens.

    Workers come from ``discovery``: ``static`` takes the ``prefill`` and ``decode`` addresses;
    ``kubernetes`` watches the EndpointSlices in ``namespace`` that ``prefill_selector`` and
    ``decode_selector`` pick (their port named ``port_name``). Checked by ``discovery_for``.
    """

    model: str
    prefill: tuple[str, ...] = ()  # static: host:port of each prefill worker
    decode: tuple[str, ...] = ()  # static: host:port of each decode worker
    discovery: str = "static"  # static or kubernetes
    namespace: str = ""  # kubernetes: the workers' namespace
    prefill_selector: str = ""  # kubernetes: label selector of the prefill workers' EndpointSlices
    decode_selector: str = ""  # kubernetes: label selector of the decode workers' EndpointSlices
    port_name: str = "grpc"  # kubernetes: the workers' gRPC port name
    host: str = "127.0.0.1"
    port: int = 50051
    max_model_len: int = 4096
    max_workers: int | None = None  # gRPC handler threads; None: one per admitted or queued stream + 16
    metrics_port: int = 0  # /metrics; 0 picks a free port (``RouterServer.metrics_port``)
    http_port: int | None = None  # OpenAI HTTP front; None: none, 0 picks a free port (``.http_port``)
    max_running: int = 256  # requests in flight through the workers
    max_queued: int = 1024  # requests waiting for a seat; more get RESOURCE_EXHAUSTED
    disaggregation: str = "conditional"  # conditional, always, or never (colocated: no prefill workers)
    local_prefill_tokens: int = 16  # conditional: decode prefills a prompt with at most this many uncached
    slo_ttft_s: float = 2.0  # goodput: a request meets its SLO with TTFT <= this and TPOT <= slo_tpot_s
    slo_tpot_s: float = 0.1
    redis_url: str = ""  # HiCache's cluster index: workers also scored by their node tier's blocks; "": none
    auth_token_file: str = ""  # bearer tokens of the public API (``router/auth_tokens.py``); "": no auth
    tls_cert: str = ""  # PEM certificate (chain) of both public ports (``router/tls.py``); "": plaintext
    tls_key: str = ""  # its PEM private key, unencrypted
    tls_client_ca: str = ""  # mutual TLS: clients need a certificate signed by this CA; "": none asked
    cluster_secret_file: str = ""  # the cluster secret sent to every worker (common/cluster_secret.py)
    internal_tls_cert: str = ""  # internal mutual TLS to the workers (common/internal_tls.py); "": plaintext
    internal_tls_key: str = ""
    internal_tls_ca: str = ""
    tenant_rate_limit: float = (
        0.0  # Generate requests a second per tenant (router/tenant_rate_limit.py); 0: none
    )
    tenant_burst: int = 0  # requests a tenant may send at once; 0: ceil(tenant_rate_limit)
    max_n: int = 16  # OpenAI front: the largest ``n`` (samples per prompt, one generation each)

    def __post_init__(self):
        for name in ("slo_ttft_s", "slo_tpot_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")
        if self.max_n < 1:
            raise ValueError(f"max_n: must be >= 1, got {self.max_n}")
        self.rate_limit()  # raises naming the flag
        check_redis_url("redis_url", self.redis_url)

    def rate_limit(self) -> TenantRateLimit | None:
        """The per-tenant limit these fields ask for, or None (``tenant_rate_limit`` 0); raises naming
        the flag (``tenant_rate_limit.from_flags``)."""
        return from_flags(self.tenant_rate_limit, self.tenant_burst)


class RouterServer:
    """A running router; ``port`` is the bound port (useful with ``port=0``).

    ``discovery`` replaces the one ``config`` names (a caller that knows its workers itself, such as
    a test or a Ray deployment, feeds them through its own ``Discovery``). ``cluster_secret``, sent
    on every call to the workers, replaces the one in ``config.cluster_secret_file``, and ``internal``
    (internal mutual TLS to the workers) the ``config.internal_tls_*`` files: a Ray actor's values.
    """

    def __init__(
        self,
        config: RouterConfig,
        discovery: Discovery | None = None,
        cluster_secret: str | None = None,
        internal: InternalTls | None = None,
    ):
        self.metrics = Metrics("router")
        self.authenticator = _authenticator(config.auth_token_file, self.metrics)  # a bad file fails first
        tls = server_tls(config.tls_cert, config.tls_key, config.tls_client_ca)
        self.tls = (
            None if tls is None else ReloadingTls(tls, on_reload_error=self.metrics.tls_reload_failures.inc)
        )
        secret = cluster_secret  # a Ray actor's, passed as a value: no file on its node
        if secret is None:
            secret = read_cluster_secret(config.cluster_secret_file) if config.cluster_secret_file else ""
        workers_tls = internal or internal_tls(
            config.internal_tls_cert, config.internal_tls_key, config.internal_tls_ca
        )
        self.discovery = discovery if discovery is not None else discovery_for(config)
        model_info = read_model_info(config.model)
        try:
            tokenizer = Tokenizer.from_pretrained(config.model)
        except TokenizerNotFoundError:
            tokenizer = None
        self.cluster_index = None
        if config.redis_url:
            self.cluster_index = ClusterIndex(config.redis_url, on_health=self.metrics.redis_health)
        self.pool = WorkerPool(
            [],
            [],
            on_health=self._worker_health,
            cluster_index=self.cluster_index,
            has_state=model_info.family in STATEFUL_FAMILIES,
            cluster_secret=secret,
            internal_tls=workers_tls,
        )
        admission = Admission(config.max_running, config.max_queued, self.metrics)
        dispatcher = Dispatcher(
            self.pool, self.metrics, config.disaggregation, config.local_prefill_tokens, admission
        )
        migrator = Migrator(dispatcher, self.metrics)
        self.discovery.start(self.pool.update)  # static: the pool is full before the port opens
        self.pool.start_probing()  # a worker that dies with no traffic is marked down all the same
        self.metrics_port = self.metrics.serve(config.host, config.metrics_port)
        servicer = GenerationServicer(
            Path(config.model).name,
            model_info,
            tokenizer,
            migrator,
            config.max_model_len,
            self.metrics,
            admission,
            config.slo_ttft_s,
            config.slo_tpot_s,
            rate_limit=config.rate_limit(),
        )
        # Each Generate stream holds a handler thread, queued ones included: size the pool for the
        # admission limits so health checks and unary calls always find one.
        threads = config.max_workers or config.max_running + config.max_queued + 16
        interceptors = [ErrorInterceptor()]
        if self.authenticator is not None:  # inside ErrorInterceptor: it sees parsed requests
            interceptors.append(AuthInterceptor(self.authenticator))
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=threads),
            interceptors=interceptors,
            maximum_concurrent_rpcs=threads,
        )
        generation_pb2_grpc.add_GenerationServicer_to_server(servicer, self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            ("baton.v1.Generation", health.SERVICE_NAME, reflection.SERVICE_NAME), self.server
        )
        address = f"{config.host}:{config.port}"
        if self.tls is None:
            self.port = self.server.add_insecure_port(address)
        else:
            self.port = self.server.add_secure_port(address, self.tls.grpc_credentials())
        if self.port == 0:
            self.discovery.stop()
            self.pool.close()
            raise ValueError(f"port: cannot listen on {config.host}:{config.port}")
        self._front_dir: str | None = None  # with TLS: the private folder of the front's socket
        front_target = _loopback(config.host, self.port)
        if self.tls is not None and config.http_port is not None:
            try:
                front_target = self._front_socket()
            except ValueError:
                self.discovery.stop()
                self.pool.close()
                raise
        self.server.start()
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self.health.set("baton.v1.Generation", health_pb2.HealthCheckResponse.SERVING)
        self.http: OpenAIFront | None = None
        self.http_port: int | None = None  # the OpenAI front's bound port; None without one
        if config.http_port is not None:
            try:
                context = None if self.tls is None else self.tls.ssl_context()
                self.http = OpenAIFront(
                    front_target,
                    config.host,
                    config.http_port,
                    self.authenticator,
                    context,
                    tokenizer=tokenizer,
                    max_n=config.max_n,
                )
            except BaseException:
                self.discovery.stop()
                self.server.stop(0).wait()
                self.pool.close()
                self._remove_front_dir()
                raise
            self.http_port = self.http.port

    def _front_socket(self) -> str:
        """A plaintext gRPC listener for the OpenAI front on a Unix socket in a folder only this user
        can enter: with TLS (mutual TLS above all) the front cannot be a client of the public port,
        and a loopback TCP port would let any local process past the certificates."""
        self._front_dir = tempfile.mkdtemp(prefix="baton-router-")  # mode 0700
        target = f"unix:{self._front_dir}/grpc.sock"
        if self.server.add_insecure_port(target) == 0:
            self._remove_front_dir()
            raise ValueError(f"http_port: cannot listen on {target} for the OpenAI front")
        return target

    def _remove_front_dir(self) -> None:
        if self._front_dir is not None:
            shutil.rmtree(self._front_dir, ignore_errors=True)
            self._front_dir = None

    def _worker_health(self, worker, up: bool | None) -> None:
        """``baton_worker_up``: 1 or 0 per worker in the pool; a removed worker's sample goes."""
        if up is not None:
            self.metrics.worker_up.labels(worker.role, worker.address).set(up)
            return
        try:
            self.metrics.worker_up.remove(worker.role, worker.address)
        except KeyError:
            pass  # never reported

    def stop(self, grace_s: float = 2.0) -> None:
        """Health NOT_SERVING, then refuse new calls and give running ones ``grace_s`` to finish."""
        self.discovery.stop()
        self.health.enter_graceful_shutdown()
        if self.http is not None:
            self.http.stop()  # first: its streams are gRPC calls into this server
        self.server.stop(grace_s).wait()
        self._remove_front_dir()
        self.pool.close()
        if self.cluster_index is not None:
            self.cluster_index.close()


def _authenticator(token_file: str, metrics: Metrics) -> Authenticator | None:
    """The public API's token check over ``token_file`` (None: no file, no authentication)."""
    if not token_file:
        return None
    tokens = TokenTable(token_file, on_reload_error=metrics.auth_reload_failures.inc)
    for reason in REASONS:  # every series from 0, so rate() sees the first refusal
        metrics.auth_refused.labels(reason)
    return Authenticator(tokens, on_refused=lambda reason: metrics.auth_refused.labels(reason).inc())


def _loopback(host: str, port: int) -> str:
    """The gRPC target for calling this process's own server: loopback when it listens everywhere."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        return f"127.0.0.1:{port}"
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
