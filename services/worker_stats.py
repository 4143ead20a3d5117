"""A worker's load as the router sees it (``WorkerStats``): computed on the engine loop thread after
every step and command, served from that snapshot so a ``Stats`` call never waits for a long step."""

from proto.baton.v1 import workers_pb2
from services.engine.engine_core import EngineCore


def worker_stats(name: str, engine: EngineCore, draining: bool = False) -> workers_pb2.WorkerStats:
    scheduler, cache = engine.scheduler, engine.cache
    queued = sum(max(0, len(r.prompt_ids) - r.num_computed) for r in (*scheduler.waiting, *scheduler.running))
    return workers_pb2.WorkerStats(
        worker=name,
        running=len(scheduler.running) + len(scheduler.reserved),
        waiting=len(scheduler.waiting),
        free_blocks=cache.blocks.num_free,
        total_blocks=cache.blocks.num_blocks,
        free_slots=cache.slots.num_free,
        total_slots=cache.slots.num_slots,
        block_size=cache.blocks.block_size,
        queued_prompt_tokens=queued,
        draining=draining,
    )


class StatsBoard:
    """The latest ``WorkerStats`` of one worker: ``update`` on the loop thread, ``latest`` anywhere.
    ``draining`` (set when the worker starts to stop) shows from the next ``update`` on."""

    def __init__(self, name: str, engine: EngineCore):
        self.name = name
        self.draining = False
        self._latest = worker_stats(name, engine)

    def update(self, engine: EngineCore) -> None:
        # One reference swap: readers see the old snapshot or the new one.
        self._latest = worker_stats(self.name, engine, self.draining)

    def latest(self) -> workers_pb2.WorkerStats:
        return self._latest
