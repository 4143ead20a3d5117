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

``on_evict(blocks, hashes)``, when set, is called once per ``allocate`` that reuses cached blocks, with
those blocks and the hashes they held, before the allocation returns and so before anything overwrites
them (the host tier's offload, one batch per allocation: ``services/engine/host_cache_connector.py``).
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
    """

    def __init__(
        self,
        layout: Layout,
        block_size: int,
        num_blocks: int,
        device: str | torch.device,
        scratch: bool = False,
    ):
        if num_blocks < 1:
            raise ValueError(f"num_blocks: must be >= 1, got {num_blocks}")
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
        self.on_evict: Callable[[list[int], list[bytes]], None] | None = None

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take now (free plus evictable cached blocks)."""
        return len(self.free_ids) + len(self.evictable)

    def can_allocate(self, count: int, reserved: int = 0) -> bool:
        """True when ``count`` blocks can be taken while ``reserved`` cached blocks are kept."""
        return count <= self.num_free - reserved

    def allocate(self, count: int) -> list[int]:
        """Take ``count`` blocks (reference count 1), evicting cached ones if needed."""
        if not self.can_allocate(count):
            raise RuntimeError(f"block pool exhausted: {count} requested, {self.num_free} available")
        ids, reused, reused_hashes = [], [], []
        for _ in range(count):
            if self.free_ids:
                block = self.free_ids.popleft()
            else:
                block, _ = self.evictable.popitem(last=False)
                evicted = self.hash_of.pop(block)
                del self.block_of[evicted]
                reused.append(block)
                reused_hashes.append(evicted)
                if self._events is not None:
                    self._events.append(CacheEvent(evicted, False))
            self.ref_counts[block] = 1
            ids.append(block)
        if reused and self.on_evict is not None:
            self.on_evict(reused, reused_hashes)
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
            self.ref_counts[block] += 1

    def register(self, block: int, block_hash: bytes) -> None:
        """Record that a used block holds the tokens ``block_hash`` names. A hash already registered
        elsewhere keeps its first block; this block then stays unregistered (a duplicate)."""
        if block_hash in self.block_of or block in self.hash_of:
            return
        self.block_of[block_hash] = block
        self.hash_of[block] = block_hash
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
