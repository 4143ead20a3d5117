"""A prefill or decode worker as a Ray actor: a ``WorkerServer`` listening on its node's IP."""

import os
from dataclasses import dataclass, replace

import ray

from common.internal_tls import InternalTls
from services.worker_config import WorkerConfig
from services.worker_server import WorkerServer


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker actor reports about itself.

    Attributes:
        name: the worker's name in routes and stats (``decode-0``).
        role: ``prefill`` or ``decode``.
        address: ``node-ip:port`` of its gRPC server, what the router dials.
        metrics_address: ``node-ip:port`` of its ``/metrics``.
        pid: the actor's process (a restart brings a new one).
        node_id: the Ray node it runs on.
    """

    name: str
    role: str
    address: str
    metrics_address: str
    pid: int
    node_id: str


def host_port(host: str, port: int) -> str:
    """``host:port``, bracketing an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@ray.remote
class WorkerActor:
    """One worker. Its gRPC server listens on all interfaces, port 0 (the OS picks): two workers
    on one node never collide, and a restarted actor (Ray re-runs ``__init__``, possibly on another
    node) comes back on a new address, which ``info()`` reports and the supervisor forwards to the
    router.

    Args:
        config: the worker; its ``host`` and ``port`` are replaced (``0.0.0.0``, 0), and so are
            ``metrics_port`` (0).
        cluster_secret: the cluster secret, as a value (a file named on the driver's node would not
            be on this one); "": none.
        internal: the internal mutual TLS, as a value too; None: plaintext.
    """

    def __init__(self, config: WorkerConfig, cluster_secret: str = "", internal: InternalTls | None = None):
        self.host = ray.util.get_node_ip_address()
        config = replace(config, host="0.0.0.0", port=0, metrics_port=0)
        self.server = WorkerServer(config, cluster_secret, internal)

    def info(self) -> WorkerInfo:
        """Where this incarnation of the worker listens."""
        return WorkerInfo(
            name=self.server.name,
            role=self.server.config.role,
            address=host_port(self.host, self.server.port),
            metrics_address=host_port(self.host, self.server.metrics_port),
            pid=os.getpid(),
            node_id=ray.get_runtime_context().get_node_id(),
        )

    def stop(self) -> None:
        """Stop serving (in-flight calls are cancelled); the actor itself is killed afterwards."""
        self.server.stop()
