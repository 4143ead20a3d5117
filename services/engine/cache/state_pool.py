"""KDA state-slot memory and its allocator (one slot per running request)."""

import torch

from .layout import Layout


class StateSlotPool:
    """``num_slots`` slots of ``layout.nbytes`` bytes, each holding one request's KDA state.

    Invariant (``check_integrity``): free + used == total, no slot both or twice.

    Args:
        layout: the slot's field layout.
        num_slots: slots in the pool.
        device: where the storage lives.
        scratch: keep one more slot of storage, ``scratch_id``, never handed out: where the padded
            rows of a captured CUDA-graph step write their state.
    """

    def __init__(self, layout: Layout, num_slots: int, device: str | torch.device, scratch: bool = False):
        if num_slots < 1:
            raise ValueError(f"num_slots: must be >= 1, got {num_slots}")
        self.layout = layout
        self.num_slots = num_slots
        self.storage = torch.zeros(num_slots + scratch, layout.nbytes, dtype=torch.uint8, device=device)
        self.scratch_id = num_slots if scratch else None
        self.free_ids = list(range(num_slots - 1, -1, -1))
        self.used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    def can_allocate(self) -> bool:
        return bool(self.free_ids)

    def allocate(self) -> int:
        """Take a free slot (lowest id first). Check ``can_allocate`` first."""
        if not self.free_ids:
            raise RuntimeError("state slot pool exhausted")
        slot = self.free_ids.pop()
        self.used.add(slot)
        return slot

    def free(self, slot: int) -> None:
        if slot not in self.used:
            raise RuntimeError(f"state slot {slot} freed while not in use")
        self.used.remove(slot)
        self.free_ids.append(slot)

    def copy_slot(self, src: int, dst: int) -> None:
        """Overwrite slot ``dst`` with slot ``src``: every layer's every field (one row copy). A
        speculative request restores its slot from its checkpoint slot this way after a rejection.

        Raises:
            RuntimeError: either slot is not in use, or they are the same slot.
        """
        for name, slot in (("src", src), ("dst", dst)):
            if slot not in self.used:
                raise RuntimeError(f"copy_slot: {name} slot {slot} is not in use")
        if src == dst:
            raise RuntimeError(f"copy_slot: src and dst are both slot {src}")
        self.storage[dst] = self.storage[src]

    def view(self, layer: int, kind: str) -> torch.Tensor:
        """``[num_slots (+ 1 scratch), *field.shape]`` view of one field across all slots (no copy)."""
        field = self.layout.field(layer, kind)
        raw = self.storage[:, field.offset : field.offset + field.nbytes]
        return raw.view(field.dtype).view(self.storage.shape[0], *field.shape)

    def check_integrity(self) -> None:
        free = set(self.free_ids)
        assert len(free) == len(self.free_ids), "a slot is in the free list twice"
        assert not free & self.used, "a used slot is in the free list"
        assert len(free) + len(self.used) == self.num_slots, (
            f"free {len(free)} + used {len(self.used)} != total {self.num_slots}"
        )
