"""The node's HiCache tier as a Ray actor: one ``baton cache`` service per node that runs workers.

``NodeCaches`` starts a ``CacheActor`` pinned to each node the first time a worker bundle lands there, and
gives that node's workers its address. The actor listens on the same fixed port on every node
(``CacheConfig.port``), so when Ray restarts it (on its node: the affinity is hard) the address the workers
hold is right again, and their clients attach to the new, empty run by themselves.
"""

from dataclasses import replace

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from services.hicache.server import CacheConfig, HostCacheServer

from .worker_actor import host_port


@ray.remote
class CacheActor:
    """A ``HostCacheServer`` on all interfaces of its node, on ``config.port``.

    Args:
        config: the tier; ``host`` and ``metrics_host`` are replaced by ``0.0.0.0``.
    """

    def __init__(self, config: CacheConfig):
        self.host = ray.util.get_node_ip_address()
        self.server = HostCacheServer(replace(config, host="0.0.0.0", metrics_host="0.0.0.0"))

    def address(self) -> str:
        """``node-ip:port`` of the tier, what the node's workers dial."""
        return host_port(self.host, self.server.port)

    def stop(self) -> None:
        """Stop serving; the actor itself is killed afterwards."""
        self.server.stop()


class NodeCaches:
    """One ``CacheActor`` per node, started on demand.

    Args:
        config: every node's tier (budgets, and the fixed port each listens on; not 0, or a restarted tier
            would come back where no worker looks).
        max_restarts: times Ray restarts a dead tier (-1: without limit).
        timeout_s: how long a tier may take to start.
    """

    def __init__(self, config: CacheConfig, max_restarts: int, timeout_s: float):
        if config.port == 0:
            raise ValueError("host_cache.port: give a fixed port (every node's tier listens on it)")
        config.validate()
        self.config = config
        self.max_restarts = max_restarts
        self.timeout_s = timeout_s
        self.actors: dict[str, object] = {}  # node id -> its tier's actor
        self.addresses: dict[str, str] = {}  # node id -> its tier's address

    def address_on(self, node_id: str) -> str:
        """The address of ``node_id``'s tier, starting it if this is the node's first worker."""
        if node_id not in self.addresses:
            actor = CacheActor.options(
                num_cpus=0,  # light, and must fit on a node whose CPUs the workers' bundles hold
                max_restarts=self.max_restarts,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
            ).remote(self.config)
            self.actors[node_id] = actor
            self.addresses[node_id] = ray.get(actor.address.remote(), timeout=self.timeout_s)
        return self.addresses[node_id]
