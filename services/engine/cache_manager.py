"""Per-request cache accounting: a request's block table and KDA slot, over the two pools.

The scheduler sees memory only through ``can_grow`` / ``grow`` / ``release`` (check, then commit).
"""

from services.engine.cache.block_pool import BlockPool
from services.engine.cache.state_pool import StateSlotPool

from .request import Request


class CacheManager:
    """Grows and releases requests' blocks and slots.

    Args:
        blocks: packed MLA block pool.
        slots: KDA state-slot pool.
    """

    def __init__(self, blocks: BlockPool, slots: StateSlotPool):
        self.blocks = blocks
        self.slots = slots

    def blocks_needed(self, request: Request, new_tokens: int) -> int:
        """Extra blocks the request needs to cache ``new_tokens`` more tokens."""
        total = request.num_computed + new_tokens
        return max(0, -(-total // self.blocks.block_size) - len(request.block_table))

    def can_grow(self, request: Request, new_tokens: int) -> bool:
        needs_slot = request.slot is None
        return self.blocks.can_allocate(self.blocks_needed(request, new_tokens)) and (
            not needs_slot or self.slots.can_allocate()
        )

    def grow(self, request: Request, new_tokens: int) -> None:
        """Give the request room for ``new_tokens`` more tokens (and a slot). ``can_grow`` first."""
        if request.slot is None:
            request.slot = self.slots.allocate()
        request.block_table.extend(self.blocks.allocate(self.blocks_needed(request, new_tokens)))

    def release(self, request: Request) -> None:
        """Return everything the request holds; its cached tokens are forgotten."""
        self.blocks.free(request.block_table)
        request.block_table = []
        if request.slot is not None:
            self.slots.free(request.slot)
            request.slot = None
        request.num_computed = 0

    def total_tokens(self) -> int:
        """Tokens the block pool can hold in all."""
        return self.blocks.num_blocks * self.blocks.block_size

    def check_integrity(self) -> None:
        self.blocks.check_integrity()
        self.slots.check_integrity()
