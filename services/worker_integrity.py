"""A worker's pools as a debug RPC (``CheckIntegrity``): consistency and what is still held.

The engine takes its ``PoolState`` on its loop thread between steps, so the counts are one consistent
picture. The fault suite asserts after every scenario that a worker with no request left holds no
block and no slot.
"""

from proto.baton.v1 import workers_pb2
from services.engine.engine_views import PoolState


def integrity_to_pb(name: str, state: PoolState, leases: int = 0) -> workers_pb2.PoolIntegrity:
    """The ``PoolIntegrity`` message of worker ``name``'s pools; ``leases``: a decode worker's
    reservations not yet claimed by a ``Decode`` call."""
    return workers_pb2.PoolIntegrity(
        worker=name,
        ok=state.ok,
        error=state.error,
        used_blocks=state.used_blocks,
        cached_blocks=state.cached_blocks,
        total_blocks=state.total_blocks,
        used_slots=state.used_slots,
        total_slots=state.total_slots,
        running=state.running,
        waiting=state.waiting,
        reserved=state.reserved,
        held=state.held,
        request_ids=state.request_ids,
        leases=leases,
    )
