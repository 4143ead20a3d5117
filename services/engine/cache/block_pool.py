"""Packed-block memory and its allocator (reference-counted, integrity-checked)."""

from collections import deque

import torch

from .layout import Layout


class BlockPool:
    """``num_blocks`` blocks of ``layout.nbytes`` bytes, handed out by id.

    Invariant (``check_integrity``): every block is either free (reference count 0, in the free
    list once) or used (count > 0, not in the free list).

    Args:
        layout: the block's field layout.
        block_size: tokens per block.
        num_blocks: blocks in the pool.
        device: where the storage lives.
    """

    def __init__(self, layout: Layout, block_size: int, num_blocks: int, device: str | torch.device):
        if num_blocks < 1:
            raise ValueError(f"num_blocks: must be >= 1, got {num_blocks}")
        self.layout = layout
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.storage = torch.zeros(num_blocks, layout.nbytes, dtype=torch.uint8, device=device)
        self.ref_counts = [0] * num_blocks
        self.free_ids: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    def can_allocate(self, count: int) -> bool:
        return count <= len(self.free_ids)

    def allocate(self, count: int) -> list[int]:
        """Take ``count`` free blocks (reference count 1). Check ``can_allocate`` first."""
        if not self.can_allocate(count):
            raise RuntimeError(f"block pool exhausted: {count} requested, {self.num_free} free")
        ids = [self.free_ids.popleft() for _ in range(count)]
        for block in ids:
            self.ref_counts[block] = 1
        return ids

    def free(self, block_ids: list[int]) -> None:
        """Drop one reference to each block; blocks reaching zero return to the free list."""
        for block in block_ids:
            if self.ref_counts[block] <= 0:
                raise RuntimeError(f"block {block} freed while not in use")
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_ids.append(block)

    def view(self, layer: int, kind: str) -> torch.Tensor:
        """``[num_blocks, *field.shape]`` view of one field across all blocks (no copy)."""
        field = self.layout.field(layer, kind)
        raw = self.storage[:, field.offset : field.offset + field.nbytes]
        return raw.view(field.dtype).view(self.num_blocks, *field.shape)

    def bytes_per_token(self) -> int:
        return self.layout.nbytes // self.block_size

    def check_integrity(self) -> None:
        """Raise AssertionError unless free + used == total and the free list matches the counts."""
        free = set(self.free_ids)
        assert len(free) == len(self.free_ids), "a block is in the free list twice"
        used = [b for b, count in enumerate(self.ref_counts) if count > 0]
        assert all(count >= 0 for count in self.ref_counts), "negative reference count"
        assert not free.intersection(used), "a used block is in the free list"
        assert len(free) + len(used) == self.num_blocks, (
            f"free {len(free)} + used {len(used)} != total {self.num_blocks}"
        )
