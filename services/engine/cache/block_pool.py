"""Packed-block memory and its allocator: reference counts, a hash registry, LRU eviction.

Every block is in exactly one of three states::

    free       ref 0, no hash           in ``free_ids``
    cached     ref 0, hash registered   in ``evictable`` (LRU order: oldest first)
    used       ref > 0 (hash optional)

``allocate`` takes free blocks first, then evicts the least recently used cached ones. ``free``
turns a block whose last reference goes away into *cached* when it carries a hash (its contents can
serve a later prefix match), else into *free*.

Cache events, once ``record_events`` has been called: a hash is *inserted* when ``register`` records
it and *evicted* when ``allocate`` reuses its cached block; ``take_events`` hands them over in order
(what a worker's load feed tells the router).

Tenants (``tenant_reserve``, ``--tenant-cache-reserve-blocks``): a registered block belongs to the
tenant whose request registered it (the prefix cache is salted by tenant, so no block is shared
between tenants). An allocation for tenant ``t`` never evicts another tenant's cached blocks below
``tenant_reserve`` of them: it skips those in the LRU scan, and ``can_allocate(..., tenant=t)`` does
not count them. One tenant's load thus cannot flush another's reserved share of the prefix cache; a
tenant's own allocations may evict its own blocks.

``on_evict(blocks, hashes, tenants)``, when set, is called once per ``allocate`` that reuses cached
blocks, with those blocks, the hashes they held and their tenants, before the allocation returns and so
before anything overwrites them (the host tier's offload, one batch per allocation:
``services/engine/host_cache_connector.py``).
"""

from collections import OrderedDict, deque
from collections.abc import Callable
from typing import NamedTuple

import torch

from .layout import Layout


class CacheEvent(NamedTuple):
    """A prefix-cache change: ``block_hash`` became reusable (``inserted``) or stopped being (evicted)."""

    block_hash: bytes
    inserted: bool


class BlockPool:
    """``num_blocks`` blocks of ``layout.nbytes`` bytes, handed out by id.

    Args:
        layout: the block's field layout.
        block_size: tokens per block.
        num_blocks: blocks in the pool.
        device: where the storage lives.
        scratch: keep one more block of storage, ``scratch_id``, never handed out: where the padded
            rows of a captured CUDA-graph step write.
        tenant_reserve: cached blocks each tenant keeps against other tenants' allocations (0: none).
    """

    def __init__(
        self,
        layout: Layout,
        block_size: int,
        num_blocks: int,
        device: str | torch.device,
        scratch: bool = False,
        tenant_reserve: int = 0,
    ):
        if num_blocks < 1:
            raise ValueError(f"num_blocks: must be >= 1, got {num_blocks}")
        if tenant_reserve < 0:
            raise ValueError(f"tenant_cache_reserve_blocks: must be >= 0, got {tenant_reserve}")
        self.tenant_reserve = tenant_reserve
        self.owner_of: dict[int, str] = {}  # registered block -> the tenant that registered it
        self.cached_by: dict[str, int] = {}  # tenant -> its cached (evictable) blocks
        self.layout = layout
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.storage = torch.zeros(num_blocks + scratch, layout.nbytes, dtype=torch.uint8, device=device)
        self.scratch_id = num_blocks if scratch else None
        self.ref_counts = [0] * num_blocks
        self.free_ids: deque[int] = deque(range(num_blocks))
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.hash_of: dict[int, bytes] = {}
        self.block_of: dict[bytes, int] = {}
        self._events: list[CacheEvent] | None = None  # None: nobody records them
        self.on_evict: Callable[[list[int], list[bytes], list[str]], None] | None = None

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take now (free plus evictable cached blocks)."""
        return len(self.free_ids) + len(self.evictable)

    def can_allocate(self, count: int, reserved: int = 0, tenant: str = "") -> bool:
        """True when ``count`` blocks can be taken for ``tenant`` while ``reserved`` cached blocks are
        kept (other tenants' reserved shares are not counted)."""
        return count <= self.num_free - reserved - self._protected_from(tenant)

    def allocate(self, count: int, tenant: str = "") -> list[int]:
        """Take ``count`` blocks (reference count 1) for ``tenant``, evicting cached ones if needed
        (never another tenant's below its reserve)."""
        if not self.can_allocate(count, tenant=tenant):
            raise RuntimeError(f"block pool exhausted: {count} requested, {self.num_free} available")
        ids, reused, reused_hashes, reused_owners = [], [], [], []
        victims = self._victims(count - len(self.free_ids), tenant)
        for _ in range(count):
            if self.free_ids:
                block = self.free_ids.popleft()
            else:
                block = next(victims)
                del self.evictable[block]
                self._uncache(block)
                evicted = self.hash_of.pop(block)
                reused_owners.append(self.owner_of.pop(block, ""))
                del self.block_of[evicted]
                reused.append(block)
                reused_hashes.append(evicted)
                if self._events is not None:
                    self._events.append(CacheEvent(evicted, False))
            self.ref_counts[block] = 1
            ids.append(block)
        if reused and self.on_evict is not None:
            self.on_evict(reused, reused_hashes, reused_owners)
        return ids

    def free(self, block_ids: list[int]) -> None:
        """Drop one reference to each block (see the module docstring for where it goes)."""
        for block in block_ids:
            if self.ref_counts[block] <= 0:
                raise RuntimeError(f"block {block} freed while not in use")
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                if block in self.hash_of:
                    self.evictable[block] = None
                    owner = self.owner_of.get(block, "")
                    self.cached_by[owner] = self.cached_by.get(owner, 0) + 1
                else:
                    self.free_ids.append(block)

    def lookup(self, block_hash: bytes) -> int | None:
        """The block registered under ``block_hash``, if any (no side effects)."""
        return self.block_of.get(block_hash)

    def acquire(self, block_ids: list[int]) -> None:
        """Take one more reference to each block (cached blocks leave the eviction list)."""
        for block in block_ids:
            if self.ref_counts[block] == 0:
                del self.evictable[block]
                self._uncache(block)
            self.ref_counts[block] += 1

    def register(self, block: int, block_hash: bytes, tenant: str = "") -> None:
        """Record that a used block holds the tokens ``block_hash`` names, for ``tenant``. A hash
        already registered elsewhere keeps its first block; this block then stays unregistered (a
        duplicate)."""
        if block_hash in self.block_of or block in self.hash_of:
            return
        self.block_of[block_hash] = block
        self.hash_of[block] = block_hash
        if tenant:
            self.owner_of[block] = tenant
        if self._events is not None:
            self._events.append(CacheEvent(block_hash, True))

    def record_events(self) -> set[bytes]:
        """Start recording cache events (see the module docstring); returns every hash registered now,
        the state the events that follow change."""
        self._events = []
        return set(self.block_of)

    def take_events(self) -> list[CacheEvent]:
        """The cache events since the last call, oldest first (empty until ``record_events``)."""
        if not self._events:
            return []
        events, self._events = self._events, []
        return events

    def view(self, layer: int, kind: str) -> torch.Tensor:
        """``[num_blocks (+ 1 scratch), *field.shape]`` view of one field across all blocks (no copy)."""
        field = self.layout.field(layer, kind)
        raw = self.storage[:, field.offset : field.offset + field.nbytes]
        return raw.view(field.dtype).view(self.storage.shape[0], *field.shape)

    def bytes_per_token(self) -> int:
        return self.layout.nbytes // self.block_size

    def _uncache(self, block: int) -> None:
        """``block`` left the eviction list: one cached block less for its tenant."""
        owner = self.owner_of.get(block, "")
        self.cached_by[owner] -= 1
        if not self.cached_by[owner]:
            del self.cached_by[owner]

    def _protected_from(self, tenant: str) -> int:
        """Cached blocks an allocation for ``tenant`` may not evict: the other tenants' reserves."""
        if not self.tenant_reserve:
            return 0
        return sum(min(n, self.tenant_reserve) for owner, n in self.cached_by.items() if owner != tenant)

    def _victims(self, count: int, tenant: str):
        """The cached blocks an allocation for ``tenant`` evicts, least recently used first: ``count``
        of them (chosen before any leaves), skipping other tenants' blocks at their reserve."""
        if count <= 0:
            return iter(())
        left, chosen = dict(self.cached_by), []
        for block in self.evictable:
            owner = self.owner_of.get(block, "")
            if owner == tenant or left[owner] > self.tenant_reserve or not self.tenant_reserve:
                left[owner] -= 1
                chosen.append(block)
                if len(chosen) == count:
                    break
        return iter(chosen)

    def check_integrity(self) -> None:
        """Raise AssertionError unless free + cached + used == total and the registry is consistent."""
        free = set(self.free_ids)
        assert len(free) == len(self.free_ids), "a block is in the free list twice"
        assert all(count >= 0 for count in self.ref_counts), "negative reference count"
        used = {b for b, count in enumerate(self.ref_counts) if count > 0}
        cached = set(self.evictable)
        assert not free & used, "a used block is in the free list"
        assert not cached & used, "a used block is in the eviction list"
        assert not free & cached, "a block is both free and cached"
        assert len(free) + len(cached) + len(used) == self.num_blocks, (
            f"free {len(free)} + cached {len(cached)} + used {len(used)} != total {self.num_blocks}"
        )
        assert all(b in self.hash_of for b in cached), "a cached block has no hash"
        assert not free & set(self.hash_of), "a free block still has a hash"
        assert all(self.block_of[h] == b for b, h in self.hash_of.items()), "hash registry out of sync"
        assert len(self.block_of) == len(self.hash_of), "hash registry out of sync"
        assert set(self.owner_of) <= set(self.hash_of), "an owner recorded for an unregistered block"
        counted: dict[str, int] = {}
        for block in cached:
            counted[self.owner_of.get(block, "")] = counted.get(self.owner_of.get(block, ""), 0) + 1
        assert counted == self.cached_by, f"cached blocks by tenant {self.cached_by} != {counted}"
