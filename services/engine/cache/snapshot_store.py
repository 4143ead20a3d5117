"""KDA state snapshots for the prefix cache, keyed by the block hash they follow, LRU-evicted.

Tenants (``tenant_reserve``, from ``--tenant-cache-reserve-blocks``): a snapshot belongs to the tenant
whose request saved it. Saving for tenant ``t`` into a full store evicts the least recently used snapshot
that is ``t``'s own, a tenant-less one, or one of a tenant holding more than ``tenant_reserve``; when
every snapshot is another tenant's reserve, nothing is saved. A KDA model's prefix hit needs the
snapshot beside the blocks, so this keeps a tenant's reserved blocks usable as a hit.
"""

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
        tenant_reserve: snapshots each tenant keeps against other tenants' saves (0: none).
    """

    def __init__(
        self, layout: Layout, num_snapshots: int, device: str | torch.device, tenant_reserve: int = 0
    ):
        self.pool = StateSlotPool(layout, num_snapshots, device)
        self.slot_of: OrderedDict[bytes, int] = OrderedDict()
        self.tenant_reserve = tenant_reserve
        self.owner_of: dict[bytes, str] = {}  # snapshot hash -> the tenant that saved it
        self.kept_by: dict[str, int] = {}  # tenant -> its snapshots

    def lookup(self, block_hash: bytes) -> int | None:
        """The snapshot slot for ``block_hash`` (no side effects)."""
        return self.slot_of.get(block_hash)

    def save(self, block_hash: bytes, state_row: torch.Tensor, tenant: str = "") -> int | None:
        """Keep a copy of one slot's bytes under ``block_hash`` for ``tenant`` (refreshes its LRU
        position if present).

        Returns:
            The snapshot slot written, or None when nothing was copied: ``block_hash`` was already kept,
            or the store is full of other tenants' reserves.
        """
        if block_hash in self.slot_of:
            self.slot_of.move_to_end(block_hash)
            return None
        if not self.pool.can_allocate():
            victim = self._victim(tenant)
            if victim is None:
                return None
            self._drop(victim)
        slot = self.pool.allocate()
        self.pool.storage[slot].copy_(state_row)
        self.slot_of[block_hash] = slot
        if tenant:
            self.owner_of[block_hash] = tenant
            self.kept_by[tenant] = self.kept_by.get(tenant, 0) + 1
        return slot

    def _victim(self, tenant: str) -> bytes | None:
        """The least recently used snapshot a save for ``tenant`` may evict, or None."""
        for block_hash in self.slot_of:
            owner = self.owner_of.get(block_hash, "")
            if not self.tenant_reserve or owner in ("", tenant) or self.kept_by[owner] > self.tenant_reserve:
                return block_hash
        return None

    def _drop(self, block_hash: bytes) -> None:
        self.pool.free(self.slot_of.pop(block_hash))
        owner = self.owner_of.pop(block_hash, "")
        if owner:
            self.kept_by[owner] -= 1
            if not self.kept_by[owner]:
                del self.kept_by[owner]

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
        assert set(self.owner_of) <= set(self.slot_of), "a snapshot owner without its snapshot"
        counts: dict[str, int] = {}
        for owner in self.owner_of.values():
            counts[owner] = counts.get(owner, 0) + 1
        assert counts == self.kept_by, "per-tenant snapshot counts out of sync"
