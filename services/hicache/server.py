"""``baton cache``: the node's host tier as a gRPC service (``HostCache``), its arenas on a NIXL agent.

Workers attach over gRPC, then read and write the pages with their own transfer backend (one-sided NIXL reads
and writes into the regions ``"blocks"`` (KV pages) and ``"state"`` (KDA pages)); the service only keeps the
index and the leases, so no page byte crosses gRPC.
"""

import os
import socket
import threading
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from common.cluster_index import ClusterIndex
from common.internal_tls import InternalTls, bind_internal_port
from common.metrics import Metrics
from common.redis_link import check_redis_url
from common.rpc.cluster_secret_interceptor import ClusterSecretInterceptor
from common.rpc.errors import ErrorInterceptor
from proto.baton.v1 import host_cache_pb2_grpc
from services.transfer import make_backend
from services.transfer.ucx_interfaces import confine_ucx

from .redis_l3 import RedisL3
from .servicer import HostCacheServicer
from .tier_l3 import TierL3

SERVICE = "baton.v1.HostCache"
GIB = 1 << 30


@dataclass(frozen=True)
class CacheConfig:
    """The cache service's one typed config.

    Attributes:
        kv_budget_bytes, kda_budget_bytes: host memory for KV pages and for KDA snapshots.
        host, port: the gRPC listen address (port 0: any free port).
        metrics_host, metrics_port: ``/metrics`` (port 0: any free port).
        metrics_interval_s: how often the ``baton_hicache_*`` metrics are refreshed from the tier.
        transfer_backend: the backend the arenas are registered with (workers must use the same).
        lease_ttl_s: a put or get lease not ended this long after it was given is ended by the tier
            (a worker died holding it); longer than any transfer (their timeout is 30 s).
        threads: gRPC handler threads.
        redis_url: HiCache's cluster index: the tier publishes its holdings there ("": not).
        node: the tier's name in the index, which the node's workers report (``WorkerConfig.node``);
            "": the host name, their default too.
        index_ttl_s, index_interval_s: how long the tier's index entries outlive its last publish, and
            how often it publishes (at most a third of the TTL).
        l3_budget_bytes: the Redis L3 below the tier (``tier_l3.py``: evicted pages written back,
            prefetches read back), a byte budget for the whole cluster; 0: no L3. Needs ``redis_url``.
        shm_dir: where the arenas live as shared-memory files that the node's workers map and copy
            rows of directly (``shared_pages.py``); "": private memory, every worker goes through NIXL.
        tenant_cache_reserve_pages: pages each tenant keeps against other tenants' puts, in each arena
            (``page_arena.py``; ``--tenant-cache-reserve-pages``); 0: plain LRU.
        cluster_secret: every call but the health service's must carry it (``--cluster-secret-file``;
            ``common/cluster_secret.py``); "": none. Left out of the config's repr.
        internal_tls: the port's internal mutual TLS (``common/internal_tls.py``: only clients with a
            certificate the cluster CA signed), or None: plaintext. Left out of the repr.
    """

    kv_budget_bytes: int
    kda_budget_bytes: int
    host: str = "127.0.0.1"
    port: int = 50070
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0
    metrics_interval_s: float = 1.0
    transfer_backend: str = "nixl"
    lease_ttl_s: float = 120.0
    threads: int = 16
    redis_url: str = ""
    node: str = ""
    index_ttl_s: float = 30.0
    index_interval_s: float = 1.0
    l3_budget_bytes: int = 0
    shm_dir: str = "/dev/shm"
    tenant_cache_reserve_pages: int = 0
    cluster_secret: str = field(default="", repr=False)
    internal_tls: InternalTls | None = field(default=None, repr=False)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first field that cannot work."""
        if self.kv_budget_bytes <= 0:
            raise ValueError(f"kv_budget_bytes: must be > 0, got {self.kv_budget_bytes} (--kv-gib)")
        if self.kda_budget_bytes < 0:
            raise ValueError(f"kda_budget_bytes: must be >= 0, got {self.kda_budget_bytes} (--kda-gib)")
        if not self.lease_ttl_s > 0:
            raise ValueError(f"lease_ttl_s: must be > 0, got {self.lease_ttl_s}")
        if self.metrics_interval_s <= 0:
            raise ValueError(f"metrics_interval_s: must be > 0, got {self.metrics_interval_s}")
        if self.threads < 1:
            raise ValueError(f"threads: must be >= 1, got {self.threads}")
        if self.tenant_cache_reserve_pages < 0:
            raise ValueError(
                f"tenant_cache_reserve_pages: must be >= 0, got {self.tenant_cache_reserve_pages} "
                "(--tenant-cache-reserve-pages)"
            )
        check_redis_url("redis_url", self.redis_url)
        if self.l3_budget_bytes < 0:
            raise ValueError(
                f"l3_budget_bytes: must be >= 0 (0: no L3), got {self.l3_budget_bytes} (--redis-l3-gib)"
            )
        if self.l3_budget_bytes and not self.redis_url:
            raise ValueError("l3_budget_bytes: an L3 lives in Redis: give --redis-url with --redis-l3-gib")
        if self.shm_dir and not (os.path.isdir(self.shm_dir) and os.access(self.shm_dir, os.W_OK)):
            raise ValueError(
                f"shm_dir: {self.shm_dir!r} is not a writable directory (--shm-dir; '' keeps the pages "
                "private to the tier, reached over NIXL only)"
            )
        if not 0 < self.index_interval_s <= self.index_ttl_s / 3:
            raise ValueError(
                f"index_interval_s: must be in (0, index_ttl_s / 3 = {self.index_ttl_s / 3:g}], "
                f"got {self.index_interval_s}"
            )


class HostCacheServer:
    """The running service: gRPC (``HostCache``, health, reflection), metrics and the transfer agent."""

    def __init__(self, config: CacheConfig):
        config.validate()
        self.config = config
        confine_ucx(config.host)  # before its NIXL agent
        self.metrics = Metrics("cache")
        self.index: ClusterIndex | None = None
        if config.redis_url:
            node = config.node or socket.gethostname()
            self.index = ClusterIndex(config.redis_url, node, config.index_ttl_s, self.metrics.redis_health)
        self.backend = make_backend(config.transfer_backend)
        self.servicer = HostCacheServicer(
            self.backend,
            config.kv_budget_bytes,
            config.kda_budget_bytes,
            config.lease_ttl_s,
            on_tier=self._tier_made,
            shm_dir=config.shm_dir,
            tenant_reserve_pages=config.tenant_cache_reserve_pages,
        )
        self.metrics_port = self.metrics.serve(config.metrics_host, config.metrics_port)
        self._stopping = threading.Event()
        self._refresher = threading.Thread(
            target=self._refresh_metrics,
            args=(config.metrics_interval_s,),
            name="hicache-metrics",
            daemon=True,
        )
        self._refresher.start()
        interceptors = [ClusterSecretInterceptor(config.cluster_secret)] if config.cluster_secret else []
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=config.threads),
            interceptors=[*interceptors, ErrorInterceptor()],
        )
        host_cache_pb2_grpc.add_HostCacheServicer_to_server(self.servicer, self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server
        )
        self.port = bind_internal_port(self.server, f"{config.host}:{config.port}", config.internal_tls)
        if self.port == 0:
            raise ValueError(f"port: cannot listen on {config.host}:{config.port}")
        self.server.start()
        for name in ("", SERVICE):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def _tier_made(self, tier) -> None:
        """The first ``Attach`` made the tier: publish it to the cluster index from now on, and put its
        L3 below it."""
        if self.index is not None:
            self.index.start(tier, self.config.index_interval_s)
        if self.config.l3_budget_bytes:
            config = self.config
            health = self.metrics.redis_health
            l3 = RedisL3(config.redis_url, config.l3_budget_bytes, tier.layout_fingerprint, health)
            self.servicer.l3 = TierL3(tier, l3, max_prefetches=max(1, config.threads // 2))

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop serving and publishing (the index entries expire), then release the arenas'
        registration and remove their shared-memory files."""
        self.server.stop(grace_s).wait()
        self._stopping.set()
        self._refresher.join()
        if self.index is not None:
            self.index.close()
        if self.servicer.l3 is not None:
            self.servicer.l3.close()
        self.backend.close()
        self.servicer.close()

    def _refresh_metrics(self, interval_s: float) -> None:
        while not self._stopping.wait(interval_s):
            tier = self.servicer.tier
            if tier is not None:
                self.metrics.observe_host_tier(tier.stats())
            if self.servicer.l3 is not None:
                self.metrics.observe_l3(self.servicer.l3.stats())
