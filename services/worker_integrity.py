"""A worker's pools as a debug RPC (``CheckIntegrity``): consistency and what is still held.

Taken on the engine loop thread between steps, so the counts are one consistent picture. The fault
suite asserts after every scenario that a worker with no request left holds no block and no slot.
"""

from proto.baton.v1 import workers_pb2
from services.engine.engine_core import EngineCore

MAX_LISTED_IDS = 64


def pool_integrity(name: str, engine: EngineCore) -> workers_pb2.PoolIntegrity:
    """The ``PoolIntegrity`` of ``engine`` (call on its loop thread)."""
    scheduler, blocks, slots = engine.scheduler, engine.cache.blocks, engine.cache.slots
    try:
        engine.cache.check_integrity()
        ok, error = True, ""
    except AssertionError as failure:
        ok, error = False, str(failure) or "check_integrity failed"
    known = sorted({*scheduler.requests, *scheduler.held})
    return workers_pb2.PoolIntegrity(
        worker=name,
        ok=ok,
        error=error,
        used_blocks=sum(1 for count in blocks.ref_counts if count > 0),
        cached_blocks=len(blocks.evictable),
        total_blocks=blocks.num_blocks,
        used_slots=slots.num_slots - slots.num_free,
        total_slots=slots.num_slots,
        running=len(scheduler.running),
        waiting=len(scheduler.waiting),
        reserved=len(scheduler.reserved),
        held=len(scheduler.held),
        request_ids=known[:MAX_LISTED_IDS],
    )
