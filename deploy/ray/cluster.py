"""The Baton cluster on Ray: worker actors in placement groups, a router actor, a supervisor.

Why plain actors and not Ray Serve deployments: a worker is a stateful gRPC server that the router
dials directly, holding its own KV blocks, KDA slots and NIXL registrations. Serve's value is its
proxy, request routing between interchangeable replicas and autoscaling; none of it applies (the
router does the routing, by cache contents and load), and a replaced Serve replica is a new
replica that nothing would tell the router about. An actor with ``max_restarts`` is exactly "run
this server, run it again if it dies", and the supervisor here forwards its new address. The
router is an actor too, pinned to the driver's node so its fixed ports are where the ``SERVING``
line says; it needs no Serve proxy because clients speak gRPC (or its own HTTP front) to it.
A router that Ray restarts binds its configured ports again, so give it fixed ones (``--port``):
with port 0 it comes back on another.

Placement: each role is one service with its own placement group, a bundle per rank (see
``placement.py``; a worker's ranks are its engine's ``world_size``); worker ``i``'s actor is rank 0, in
its first bundle (a restart stays in it), and starts its other ranks as local processes
(``services/engine/parallel/rank_group.py``), so a multi-rank worker's bundles must share a node
(``STRICT_PACK``).

Supervision, every ``supervise_interval_s``: ask each worker actor for its ``WorkerInfo`` (one
call outstanding per worker; a restarting actor answers once it is back), and if the router's
worker lists differ from the actors' addresses, send it the new ones. The check is level-based,
so it also repairs a router that Ray itself restarted with its first lists.
"""

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import ray
from ray.util.placement_group import placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from common.internal_tls import InternalTls
from deploy.local.launcher import with_host_cache
from router.server import RouterConfig
from services.hicache.server import CacheConfig
from services.worker_config import WorkerConfig

from .cache_actor import NodeCaches
from .placement import STRATEGIES, ServicePlacement
from .router_actor import RouterActor, RouterEndpoints
from .worker_actor import WorkerActor, WorkerInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RayClusterConfig:
    """The cluster on Ray.

    Attributes:
        router: the router; its worker lists are filled in at start, its ``host`` is ``0.0.0.0``.
            ``disaggregation="never"`` (colocated) runs no prefill workers.
        workers: ``{role: WorkerConfig}``, each role's workers' config (``baton serve`` builds them
            from its flags, as for local workers); each worker gets its own ``name``, the actor sets
            its address, and the engine's ``device`` becomes ``cuda`` when workers get GPUs.
        prefill_workers, decode_workers: workers per role.
        worker_num_cpus, worker_num_gpus: resources of each worker rank (its bundle).
        placement_strategy: ``PACK``, ``STRICT_PACK`` or ``SPREAD`` for each role's group.
        max_restarts: times Ray restarts a dead worker or router (-1: without limit).
        ready_timeout_s: how long placement and each start may take.
        supervise_interval_s: how often the supervisor checks worker addresses.
        host_cache: the HiCache tier started on every node that runs workers (``cache_actor.py``; its
            ``port`` is the fixed port on each node), every worker given its node's; None: no tier.
        cluster_secret: the secret every internal call needs, given to each actor as a value (the
            router, the workers and each node's tier); "": none.
        internal_tls: the internal mutual TLS every actor serves and calls with, given as a value too
            (``common/internal_tls.py``); None: plaintext.
    """

    router: RouterConfig
    workers: Mapping[str, WorkerConfig]
    prefill_workers: int = 1
    decode_workers: int = 1
    worker_num_cpus: float = 1.0
    worker_num_gpus: float = 0.0
    placement_strategy: str = "PACK"
    max_restarts: int = -1
    ready_timeout_s: float = 300.0
    supervise_interval_s: float = 0.5
    host_cache: CacheConfig | None = None
    cluster_secret: str = field(default="", repr=False)
    internal_tls: InternalTls | None = field(default=None, repr=False)

    def __post_init__(self):
        if self.decode_workers < 1:
            raise ValueError("decode_workers: need at least one")
        if self.router.disaggregation != "never" and self.prefill_workers < 1:
            raise ValueError("prefill_workers: need at least one (or colocated)")
        if self.placement_strategy not in STRATEGIES:
            raise ValueError(f"placement_strategy: {self.placement_strategy!r} is not one of {STRATEGIES}")
        if self.max_restarts < -1:
            raise ValueError(f"max_restarts: must be >= -1, got {self.max_restarts}")
        for role in self._roles():  # validates the resources before anything starts
            config = self.workers.get(role)
            if config is None or config.role != role:
                raise ValueError(f"workers: needs a {role} WorkerConfig")
            ranks = config.engine.world_size
            if ranks > 1 and self.placement_strategy != "STRICT_PACK":
                raise ValueError(
                    f"--placement-strategy: a {role} worker runs {ranks} ranks as local processes of its "
                    "actor, so its bundles must share a node: use STRICT_PACK"
                )
            if ranks > 1 and self.worker_num_gpus:
                raise ValueError(
                    f"--worker-num-gpus: multi-rank {role} workers on Ray GPUs are not supported yet (Ray "
                    "shows the actor only its own bundle's GPU); run them with `baton worker` or Helm"
                )
        self.placements()

    def _roles(self) -> dict[str, int]:
        """``{role: workers}`` of the roles that run workers."""
        prefill = 0 if self.router.disaggregation == "never" else self.prefill_workers
        return {role: n for role, n in (("prefill", prefill), ("decode", self.decode_workers)) if n}

    def placements(self) -> list[ServicePlacement]:
        """One service per role that runs workers, a bundle per rank of each worker."""
        return [
            ServicePlacement(
                role,
                n,
                self.worker_num_cpus,
                self.worker_num_gpus,
                self.placement_strategy,
                ranks_per_worker=self.workers[role].engine.world_size,
            )
            for role, n in self._roles().items()
        ]


# Ray gives a starting node a fixed 30 s to register with its GCS; on a machine saturated by other
# work (a CI box running the test suite beside it) that can pass without anything being wrong.
RAY_START_ATTEMPTS = 3


def init_ray(ray_address: str | None = None, attempts: int = RAY_START_ATTEMPTS, **options) -> None:
    """``ray.init(address=ray_address, **options)``, retried when a Ray instance started here times
    out registering its node (Ray's "timed out during startup"): the half-started instance is shut
    down first. Connecting to a running cluster is not retried; other errors are raised at once.

    A Ray instance started here (no address) runs its workers at normal priority: Ray nices worker
    processes (+15) so that its own daemons stay responsive, and on a shared machine that starves
    the serving workers behind any busy process. A cluster that ``ray start`` brought up keeps its
    own setting (``RAY_worker_niceness``).
    """
    starts_one = ray_address is None and not os.environ.get("RAY_ADDRESS")
    if starts_one:
        options = {"_system_config": {"worker_niceness": 0}, **options}
    for attempt in range(1, attempts + 1):
        try:
            ray.init(address=ray_address, **options)
            return
        except Exception as error:
            if not starts_one or "timed out during startup" not in str(error) or attempt == attempts:
                raise
            log.warning("Ray did not start (attempt %d of %d): %s; starting again", attempt, attempts, error)
            ray.shutdown()


@dataclass
class RayWorker:
    """A worker actor as the driver tracks it: ``info`` is its last reported incarnation."""

    name: str
    role: str
    actor: object
    info: WorkerInfo
    restarts: int = 0  # new addresses seen since start
    pending: object = None  # the outstanding ``info()`` call, if any


class RayCluster:
    """Starts the cluster on the connected Ray cluster (``ray.init(address=ray_address)`` first when
    Ray is not initialised; ``stop()`` then shuts Ray down again). ``stop()`` kills every actor and
    removes the placement groups, also when start fails half way.
    """

    def __init__(self, config: RayClusterConfig, ray_address: str | None = None):
        self.config = config
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:
            init_ray(ray_address)
        self.groups: dict[str, object] = {}
        self.workers: list[RayWorker] = []
        self.router = None
        self.caches: NodeCaches | None = None
        self.endpoints: RouterEndpoints | None = None
        self._actors: list = []  # every actor started, for stop() even when start fails half way
        self._stopping = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, name="ray-supervisor", daemon=True)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self._supervisor.start()

    def _start(self) -> None:
        config = self.config
        pending = []
        if config.host_cache is not None:
            tier = replace(
                config.host_cache, cluster_secret=config.cluster_secret, internal_tls=config.internal_tls
            )
            self.caches = NodeCaches(tier, config.max_restarts, config.ready_timeout_s)
        for service in config.placements():
            group = self.groups[service.role] = service.create(config.ready_timeout_s)
            nodes = placement_group_table(group)["bundles_to_node_id"]  # bundle index -> node id
            worker = config.workers[service.role]
            if config.worker_num_gpus:  # the actor sees its own GPUs only, as cuda
                worker = replace(worker, engine=replace(worker.engine, device="cuda"))
            for i in range(service.workers):
                name = f"{service.role}-{i}"
                if self.caches is not None:  # the tier of the node this worker's bundles are on
                    node = nodes[service.bundle_index(i)]
                    worker = with_host_cache(worker, self.caches.address_on(node))
                actor = WorkerActor.options(
                    num_cpus=service.num_cpus,
                    num_gpus=service.num_gpus,
                    max_restarts=config.max_restarts,
                    scheduling_strategy=service.strategy_for(group, i),
                ).remote(replace(worker, name=name), config.cluster_secret, config.internal_tls)
                self._actors.append(actor)
                pending.append((service.role, name, actor))
        infos = self._get([actor.info.remote() for _, _, actor in pending], "workers")
        self.workers = [RayWorker(n, r, a, info) for (r, n, a), info in zip(pending, infos, strict=True)]
        prefill, decode = self.addresses()
        self.router = RouterActor.options(
            num_cpus=0,  # light, and must fit on the driver's node whatever that node offers
            max_restarts=config.max_restarts,
            scheduling_strategy=NodeAffinitySchedulingStrategy(
                node_id=ray.get_runtime_context().get_node_id(), soft=False
            ),
        ).remote(
            replace(config.router, prefill=prefill, decode=decode), config.cluster_secret, config.internal_tls
        )
        self._actors.append(self.router)
        self.endpoints = self._get([self.router.endpoints.remote()], "router")[0]

    def _get(self, refs: list, what: str) -> list:
        try:
            return ray.get(refs, timeout=self.config.ready_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(f"{what}: not up within {self.config.ready_timeout_s:.0f}s") from None
        except ray.exceptions.RayActorError as error:
            raise RuntimeError(f"{what}: an actor failed to start: {error}") from None

    def addresses(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """``(prefill, decode)`` worker addresses as last reported by the actors."""
        by_role = {
            role: tuple(w.info.address for w in self.workers if w.role == role)
            for role in ("prefill", "decode")
        }
        return by_role["prefill"], by_role["decode"]

    def reconcile(self, timeout_s: float = 0.0) -> None:
        """One supervision pass: collect addresses that answered within ``timeout_s``, then make the
        router's lists match them. The supervisor thread calls it; not for concurrent use."""
        for worker in self.workers:
            if worker.pending is None:
                worker.pending = worker.actor.info.remote()
        ready, _ = ray.wait(
            [w.pending for w in self.workers], num_returns=len(self.workers), timeout=timeout_s
        )
        for worker in self.workers:
            if worker.pending not in ready:
                continue  # restarting (or busy): keep the last known address
            ref, worker.pending = worker.pending, None
            try:
                info = ray.get(ref)
            except ray.exceptions.ActorUnavailableError:
                log.info("%s is restarting", worker.name)
                continue
            except ray.exceptions.RayError as error:  # died for good (max_restarts spent), or a bug
                log.error("%s is unreachable: %s", worker.name, error)
                continue
            if info.address != worker.info.address:
                worker.restarts += 1
                log.warning("%s is back at %s (was %s)", worker.name, info.address, worker.info.address)
            worker.info = info
        want = self.addresses()
        if ray.get(self.router.workers.remote(), timeout=30) != want:
            ray.get(self.router.update_workers.remote(*want), timeout=60)
            log.warning("router now routes to prefill=%s decode=%s", *want)

    def _supervise(self) -> None:
        while not self._stopping.wait(self.config.supervise_interval_s):
            try:
                self.reconcile()
            except ray.exceptions.ActorUnavailableError:
                log.info("the router is restarting")
            except Exception as error:  # a slow call, a router that died for good: try again
                log.warning("supervision pass failed: %s", error)

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop serving, kill every actor, remove the placement groups (and shut Ray down if this
        cluster started it). Safe to call twice."""
        self._stopping.set()
        if self._supervisor.is_alive():
            self._supervisor.join()
        actors, self._actors = self._actors, []
        if self.caches is not None:  # every node's tier
            actors += self.caches.actors.values()
            self.caches = None
        if actors:
            ray.wait([a.stop.remote() for a in actors], num_returns=len(actors), timeout=grace_s)
        for actor in actors:
            ray.kill(actor, no_restart=True)
        for group in self.groups.values():
            remove_placement_group(group)
        self.router, self.workers, self.groups = None, [], {}
        if self.owns_ray and ray.is_initialized():
            ray.shutdown()
