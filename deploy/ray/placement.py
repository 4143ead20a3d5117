"""Where a service's ranks go: one Ray placement group per service, one bundle per rank.

A *service* is all the workers of one role (``prefill`` or ``decode``). Each worker has
``ranks_per_worker`` ranks (its engine's ``world_size``: tp x dcp x pcp x pp), and every rank gets its
own bundle, worker-major::

    bundles:  [ w0.r0 | w0.r1 | ... | w0.r(R-1) | w1.r0 | ... | w(W-1).r(R-1) ]
    index of (worker w, rank r) = w * R + r

``PACK`` (the default) puts the bundles on as few nodes as fit and spills over when they do not;
``STRICT_PACK`` insists on one node (a whole role on one machine); ``SPREAD`` puts them on as many
nodes as it can (a node's loss takes fewer workers with it).
"""

from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

STRATEGIES = ("PACK", "STRICT_PACK", "SPREAD")


@dataclass(frozen=True)
class ServicePlacement:
    """The bundles one service needs.

    Attributes:
        role: ``prefill`` or ``decode`` (names the placement group ``baton-<role>``).
        workers: how many workers the service runs.
        num_cpus: logical CPUs per rank.
        num_gpus: GPUs per rank (0: none asked for).
        strategy: one of ``STRATEGIES``.
        ranks_per_worker: bundles per worker; all of a worker's ranks are adjacent.
    """

    role: str
    workers: int
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    strategy: str = "PACK"
    ranks_per_worker: int = 1

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"placement_strategy: {self.strategy!r} is not one of {', '.join(STRATEGIES)}")
        if self.workers < 1:
            raise ValueError(f"workers: a placed service needs at least one, got {self.workers}")
        if self.ranks_per_worker < 1:
            raise ValueError(f"ranks_per_worker: must be >= 1, got {self.ranks_per_worker}")
        if self.num_cpus < 0 or self.num_gpus < 0 or self.num_cpus + self.num_gpus == 0:
            # Ray refuses empty bundles: a rank must ask for something.
            raise ValueError(
                f"worker_num_cpus / worker_num_gpus: need >= 0 and not both 0, "
                f"got {self.num_cpus} / {self.num_gpus}"
            )

    def bundle(self) -> dict[str, float]:
        """One rank's resources, as Ray spells them."""
        resources = {"CPU": float(self.num_cpus)}
        if self.num_gpus:
            resources["GPU"] = float(self.num_gpus)
        return resources

    def bundles(self) -> list[dict[str, float]]:
        """All bundles, worker-major (see the module docstring)."""
        return [self.bundle() for _ in range(self.workers * self.ranks_per_worker)]

    def bundle_index(self, worker: int, rank: int = 0) -> int:
        """The bundle of ``worker``'s ``rank``."""
        if not (0 <= worker < self.workers and 0 <= rank < self.ranks_per_worker):
            raise IndexError(f"no bundle for worker {worker} rank {rank} of {self.role}")
        return worker * self.ranks_per_worker + rank

    def create(self, timeout_s: float) -> PlacementGroup:
        """Reserve the bundles; waits until Ray has placed them all.

        Raises:
            TimeoutError: the cluster cannot hold them under ``strategy`` within ``timeout_s`` (the
                group is removed again, so nothing stays reserved).
        """
        group = placement_group(self.bundles(), strategy=self.strategy, name=f"baton-{self.role}")
        ready, _ = ray.wait([group.ready()], timeout=timeout_s)
        if not ready:
            remove_placement_group(group)
            raise TimeoutError(
                f"{self.role}: Ray could not place {len(self.bundles())} bundle(s) of {self.bundle()} "
                f"with {self.strategy} within {timeout_s:.0f}s (see `ray status` for free resources)"
            )
        return group

    def strategy_for(self, group: PlacementGroup, worker: int, rank: int = 0):
        """The scheduling strategy that puts an actor on ``worker``'s ``rank`` bundle of ``group``."""
        return PlacementGroupSchedulingStrategy(
            placement_group=group,
            placement_group_bundle_index=self.bundle_index(worker, rank),
            placement_group_capture_child_tasks=True,
        )
