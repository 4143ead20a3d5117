"""A worker's load as the router sees it (``WorkerStats``): the engine takes its ``WorkerLoad`` once per
pass on its loop thread; this board turns it into the proto and serves the latest one, so a ``Stats``
call never waits for a long step. (The Prometheus pool gauges are the other view of the same load:
``Metrics.observe_load``.)"""

from proto.baton.v1 import workers_pb2
from services.engine.engine_views import WorkerLoad


def load_to_pb(
    name: str, load: WorkerLoad, draining: bool = False, node: str = ""
) -> workers_pb2.WorkerStats:
    return workers_pb2.WorkerStats(
        worker=name,
        node=node,
        running=load.running,
        waiting=load.waiting,
        free_blocks=load.free_blocks,
        total_blocks=load.total_blocks,
        free_slots=load.free_slots,
        total_slots=load.total_slots,
        block_size=load.block_size,
        queued_prompt_tokens=load.queued_prompt_tokens,
        draining=draining,
        adapters=load.adapters,
    )


class StatsBoard:
    """The latest ``WorkerStats`` of one worker: ``update`` on the loop thread, ``latest`` anywhere.
    ``draining`` (set when the worker starts to stop) shows from the next ``update`` on. ``node``: the
    node whose HiCache tier the worker uses (the router scores the tier's holdings by it)."""

    def __init__(self, name: str, node: str = ""):
        self.name = name
        self.node = node
        self.draining = False
        self._latest = workers_pb2.WorkerStats(worker=name, node=node)  # until the engine's first pass

    def update(self, load: WorkerLoad) -> None:
        # One reference swap: readers see the old snapshot or the new one.
        self._latest = load_to_pb(self.name, load, self.draining, self.node)

    def latest(self) -> workers_pb2.WorkerStats:
        return self._latest
