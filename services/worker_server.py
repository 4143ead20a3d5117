"""Starts a prefill or decode worker: engine loop, transfer backend, gRPC server with health checks."""

import logging
import socket
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from common.cluster_secret import read_cluster_secret
from common.internal_tls import InternalTls, bind_internal_port, internal_tls
from common.metrics import Metrics
from common.rpc.cluster_secret_interceptor import ClusterSecretInterceptor
from common.rpc.errors import ErrorInterceptor
from proto.baton.v1 import workers_pb2_grpc
from services.engine.engine_core import EngineCore
from services.engine.engine_service import EngineService
from services.engine.engine_views import EnginePass
from services.rpc.convert import layout_to_pb
from services.transfer import make_backend
from services.transfer.inbox import SharedTransfer
from services.transfer.ucx_interfaces import confine_ucx

from .decode.servicer import DecodeServicer
from .fault_delays import FaultDelays
from .load_feed import LoadFeed
from .prefill.servicer import PrefillServicer
from .worker_config import WorkerConfig
from .worker_drain import Drain
from .worker_stats import StatsBoard

log = logging.getLogger(__name__)


class WorkerServer:
    """A running worker. ``drain()`` stops it gracefully (``services.worker_drain``); ``stop()`` then
    closes it, cancelling whatever is still in flight.

    With a cluster secret (``cluster_secret``, else the one in ``config.cluster_secret_file``) every
    call but the health service's must carry it, and the worker sends it to its node's tier. With
    internal TLS (``internal``, a Ray actor's value, else ``config.internal_tls_*``) its port is mutual
    TLS and its tier calls go over it (``common/internal_tls.py``).
    """

    def __init__(
        self, config: WorkerConfig, cluster_secret: str | None = None, internal: InternalTls | None = None
    ):
        self.config = config
        confine_ucx(config.host)  # before any NIXL agent: the engine's host-tier rows may open one
        secret = cluster_secret  # a Ray actor's, passed as a value: no file on its node
        if secret is None:  # read first: a bad file fails before the engine loads
            secret = read_cluster_secret(config.cluster_secret_file) if config.cluster_secret_file else ""
        self.tls = internal or internal_tls(
            config.internal_tls_cert, config.internal_tls_key, config.internal_tls_ca
        )
        self.name = config.name or f"{config.role}-{config.port}"
        self.metrics = Metrics(config.role)
        self.metrics_port = self.metrics.serve(config.host, config.metrics_port)
        ttl = config.reservation_ttl_s if config.role == "decode" else None
        core = EngineCore(
            config.engine, redis_url=config.redis_url, cluster_secret=secret, internal_tls=self.tls
        )
        self.engine = EngineService(core, reservation_ttl_s=ttl)
        self.metrics.record_engine(self.engine.info)
        self.node = config.node or socket.gethostname()
        self.stats = StatsBoard(self.name, self.node)
        info = self.engine.info
        self.load_feed = LoadFeed(
            self.stats,
            info.model_fingerprint,
            info.prefix_caching,
            self.engine.cached_at_start,
            layout=layout_to_pb(self.engine.layout),
        )
        backend = make_backend(config.transfer_backend)
        self.engine.register_pools(backend, sends=config.role == "prefill")
        # A notification no one waited for within two reservation lifetimes: its request is gone.
        self.transfer = SharedTransfer(backend, stale_after_s=2 * config.reservation_ttl_s)
        self.drain_state = Drain(self.name)
        # A decode stream, a reservation's lease or a prefill call holds a handler thread while its
        # request runs or waits (a lease and a decode stream share one seat, in turn): room for every
        # sequence slot twice over, and spare threads for health checks and stats.
        threads = config.max_workers or 2 * config.engine.max_num_seqs + 16
        interceptors = [ClusterSecretInterceptor(secret)] if secret else []
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=threads), interceptors=[*interceptors, ErrorInterceptor()]
        )
        faults = FaultDelays.parse(config.role, config.fault_delays)
        self.decode: DecodeServicer | None = None
        if config.role == "decode":
            self.decode = DecodeServicer(
                self.name,
                self.engine,
                self.transfer,
                self.stats,
                self.metrics,
                self.drain_state,
                release_grace_s=config.release_grace_s,
                faults=faults,
                load_feed=self.load_feed,
            )
            workers_pb2_grpc.add_DecodeWorkerServicer_to_server(self.decode, self.server)
            service = "baton.v1.DecodeWorker"
        else:
            workers_pb2_grpc.add_PrefillWorkerServicer_to_server(
                PrefillServicer(
                    self.name,
                    self.engine,
                    self.transfer,
                    self.metrics,
                    self.stats,
                    self.drain_state,
                    fail_transfers=config.fail_transfers,
                    stray_handoff_writes=config.stray_handoff_writes,
                    handoff_checksum=config.handoff_checksum,
                    faults=faults,
                    load_feed=self.load_feed,
                ),
                self.server,
            )
            service = "baton.v1.PrefillWorker"
        self.engine.observe(self._after_pass)  # the gauges and Stats are filled before serving
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (service, health.SERVICE_NAME, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, self.server)
        self.port = bind_internal_port(self.server, f"{config.host}:{config.port}", self.tls)
        if self.port == 0:
            raise ValueError(f"port: cannot listen on {config.host}:{config.port}")
        self.server.start()
        for name in ("", service):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.service = service

    def _after_pass(self, report: EnginePass) -> None:
        """After every engine pass and command (loop thread): the leases of reservations the TTL
        freed end, and the one load the pass took feeds the gauges, the stats snapshot and (with the
        pass's cache events) the load feed."""
        if report.expired:
            self.decode.expired(list(report.expired))
            log.warning(
                "freed %d reservation(s) whose state never arrived: %s",
                len(report.expired),
                list(report.expired),
            )
        self.metrics.observe_load(report.load)
        self.metrics.observe_queue_times(report.queue_times)
        self.metrics.observe_prefetches(report.prefetches)
        self.metrics.observe_prefix_cache(report.cache_counts, report.cache_events)
        self.metrics.observe_spec(report.spec_counts)
        self.stats.update(report.load)
        self.load_feed.publish(report.cache_events)

    def drain(self, hurry: threading.Event | None = None) -> bool:
        """Admit nothing new (health NOT_SERVING, stats ``draining``, refusals) and wait up to
        ``grace_period_s`` (or until ``hurry`` is set) for the work in flight: running streams,
        reservations whose state is arriving, prefills and their handoff writes. Streams still
        running after that end with UNAVAILABLE, for the router to move. Returns whether everything
        finished in time."""
        self.health.enter_graceful_shutdown()
        self.drain_state.start()
        self.stats.draining = True
        self.engine.refresh()  # the router's load feed and next Stats call see it
        deadline = time.monotonic() + self.config.grace_period_s
        hurry = hurry or threading.Event()
        while self.drain_state.admitting or self.engine.has_unfinished():
            if time.monotonic() >= deadline or hurry.wait(0.1):
                log.warning("%s: grace period over with work in flight; ending its streams", self.name)
                self.drain_state.expire()
                return False
        log.info("%s: drained", self.name)
        return True

    def stop(self, grace_s: float = 2.0) -> None:
        self.health.enter_graceful_shutdown()
        self.load_feed.close()  # WatchLoad streams end now instead of holding the server's grace period
        self.server.stop(grace_s).wait()
        if self.decode is not None:
            self.decode.close()
        self.transfer.close()
        self.engine.close()
