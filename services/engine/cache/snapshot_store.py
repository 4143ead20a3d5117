"""KDA state snapshots for the prefix cache, keyed by the block hash they follow, LRU-evicted."""

from collections import OrderedDict

import torch

from .layout import Layout
from .state_pool import StateSlotPool


class SnapshotStore:
    """Copies of request state slots taken at block boundaries.

    A snapshot under hash ``h_i`` is the KDA state after the tokens of blocks ``0..i``; restoring it
    into a request's slot lets the request skip those tokens. Full: the least recently used goes.

    Args:
        layout: the state-slot layout (snapshots are whole slots, byte for byte).
        num_snapshots: how many snapshots are kept.
        device: where they live.
    """

    def __init__(self, layout: Layout, num_snapshots: int, device: str | torch.device):
        self.pool = StateSlotPool(layout, num_snapshots, device)
        self.slot_of: OrderedDict[bytes, int] = OrderedDict()

    def lookup(self, block_hash: bytes) -> int | None:
        """The snapshot slot for ``block_hash`` (no side effects)."""
        return self.slot_of.get(block_hash)

    def save(self, block_hash: bytes, state_row: torch.Tensor) -> int | None:
        """Keep a copy of one slot's bytes under ``block_hash`` (refreshes its LRU position if present).

        Returns:
            The snapshot slot written, or None when ``block_hash`` was already kept (nothing copied).
        """
        if block_hash in self.slot_of:
            self.slot_of.move_to_end(block_hash)
            return None
        if not self.pool.can_allocate():
            _, oldest = self.slot_of.popitem(last=False)
            self.pool.free(oldest)
        slot = self.pool.allocate()
        self.pool.storage[slot].copy_(state_row)
        self.slot_of[block_hash] = slot
        return slot

    def restore(self, block_hash: bytes, state_row: torch.Tensor) -> int:
        """Copy the snapshot into a request's slot bytes and mark it recently used.

        Returns:
            The snapshot slot read.
        """
        self.slot_of.move_to_end(block_hash)
        slot = self.slot_of[block_hash]
        state_row.copy_(self.pool.storage[slot])
        return slot

    def check_integrity(self) -> None:
        self.pool.check_integrity()
        assert set(self.slot_of.values()) == self.pool.used, "snapshot registry out of sync"
