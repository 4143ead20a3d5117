"""The router as a Ray actor: a ``RouterServer`` on fixed ports of its node, told of worker moves."""

from dataclasses import dataclass, replace

import ray

from common.internal_tls import InternalTls
from router.server import RouterConfig, RouterServer

from .worker_actor import host_port


@dataclass(frozen=True)
class RouterEndpoints:
    """Where clients reach the router: ``node-ip:port`` strings (``http`` None without the front)."""

    grpc: str
    metrics: str
    http: str | None


@ray.remote
class RouterActor:
    """The router, listening on all interfaces of its node on ``config.port`` (and ``http_port``).

    A worker actor that Ray restarts comes back on a new address; ``update_workers`` swaps the
    router's worker lists in place, so the router keeps its ports and its other requests.
    If Ray restarts this actor, it comes back with the lists it was created with; the supervisor
    notices (``workers()``) and sends the current ones.

    Args:
        config: the router, with the first worker lists; ``host`` is replaced by ``0.0.0.0``.
        cluster_secret: sent to the workers, as a value (as ``WorkerActor``'s); "": none.
        internal: the internal mutual TLS to the workers, as a value; None: plaintext.
    """

    def __init__(self, config: RouterConfig, cluster_secret: str = "", internal: InternalTls | None = None):
        self.host = ray.util.get_node_ip_address()
        self.config = replace(config, host="0.0.0.0")
        self.server = RouterServer(self.config, cluster_secret=cluster_secret, internal=internal)

    def endpoints(self) -> RouterEndpoints:
        """The bound addresses (useful when a port was given as 0)."""
        http = self.server.http_port
        return RouterEndpoints(
            grpc=host_port(self.host, self.server.port),
            metrics=host_port(self.host, self.server.metrics_port),
            http=None if http is None else host_port(self.host, http),
        )

    def workers(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The ``(prefill, decode)`` addresses the router routes to now."""
        return self.config.prefill, self.config.decode

    def update_workers(self, prefill: tuple[str, ...], decode: tuple[str, ...]) -> None:
        """Route to exactly these workers from now on (``WorkerPool.update``: requests in flight on a
        dropped worker finish on it; new requests go to the new addresses)."""
        self.server.pool.update(list(prefill), list(decode))
        self.config = replace(self.config, prefill=tuple(prefill), decode=tuple(decode))

    def stop(self) -> None:
        """Stop serving; the actor itself is killed afterwards."""
        self.server.stop()
