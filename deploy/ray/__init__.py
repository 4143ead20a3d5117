"""The Baton cluster on Ray (``baton serve --ray``): workers as restartable actors in placement groups.

Needs ``pip install 'baton[ray]'`` on the driver and on every node of the Ray cluster.
"""

from .cluster import RayCluster, RayClusterConfig, RayWorker
from .placement import STRATEGIES, ServicePlacement
from .router_actor import RouterActor, RouterEndpoints
from .worker_actor import WorkerActor, WorkerInfo

__all__ = [
    "STRATEGIES",
    "RayCluster",
    "RayClusterConfig",
    "RayWorker",
    "RouterActor",
    "RouterEndpoints",
    "ServicePlacement",
    "WorkerActor",
    "WorkerInfo",
]
