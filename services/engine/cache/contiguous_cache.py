"""``ContiguousCache``: private pools for the full-sequence forward, one growing block per sequence."""

import torch

from kernels.kda.fixed_chunk import CHUNK as FIXED_CHUNK
from services.engine.model.config import ModelConfig
from services.engine.model.step_metadata import SequenceStep

from .block_pool import BlockPool
from .layout import block_layout, slot_layout
from .paged_cache import PagedModelCache
from .state_pool import StateSlotPool

_MIN_CAPACITY = 16


class ContiguousCache:
    """A ``ModelCache`` for a fixed set of sequences: sequence ``i`` owns block ``i`` and slot ``i``,
    and the block grows (to the next power of two, contents copied) as tokens arrive.

    Args:
        num_sequences: how many sequences the forwards that use it carry.
        config: the model's sizes.
        dtype: the model's compute dtype.
        device: where the pools live.
        batch_invariant: keep CF-BI open-chunk rows in the slots (the invariant numerics' KDA state).
        tp: the model's TP degree (a slot holds the rank's KDA heads).
    """

    def __init__(
        self,
        num_sequences: int,
        config: ModelConfig,
        dtype: torch.dtype,
        device: str | torch.device,
        batch_invariant: bool = False,
        tp: int = 1,
    ):
        self.num_tokens = [0] * num_sequences
        self.config, self.dtype, self.device = config, dtype, device
        slots = StateSlotPool(
            slot_layout(config, dtype, FIXED_CHUNK if batch_invariant else 0, tp), num_sequences, device
        )
        for _ in range(num_sequences):
            slots.allocate()
        self._paged = self._pools(_MIN_CAPACITY, slots)

    def _pools(self, capacity: int, slots: StateSlotPool) -> PagedModelCache:
        layout = block_layout(self.config, capacity, self.dtype)
        blocks = BlockPool(layout, capacity, len(self.num_tokens), self.device)
        blocks.allocate(len(self.num_tokens))
        return PagedModelCache(blocks, slots, self.config, self.dtype)

    @property
    def block_size(self) -> int:
        return self._paged.block_size

    def steps(self, new_tokens: list[list[int]]) -> list[SequenceStep]:
        """The step of every sequence with ``new_tokens`` (an empty list leaves a sequence out of the
        step), growing the blocks to fit them first."""
        longest = max(past + len(t) for past, t in zip(self.num_tokens, new_tokens, strict=True))
        if longest > self.block_size:
            self._grow(max(longest, 2 * self.block_size))
        return [
            SequenceStep(tuple(tokens), past, (seq,), seq)
            for seq, (past, tokens) in enumerate(zip(self.num_tokens, new_tokens, strict=True))
            if tokens
        ]

    def advance(self, new_tokens: list[list[int]]) -> None:
        """Record that a forward wrote ``new_tokens``."""
        self.num_tokens = [past + len(t) for past, t in zip(self.num_tokens, new_tokens, strict=True)]

    def _grow(self, capacity: int) -> None:
        capacity = 1 << (capacity - 1).bit_length()
        old = self._paged
        self._paged = self._pools(capacity, old.slots)
        for field in old.blocks.layout.fields:
            self._paged.blocks.view(field.layer, field.kind)[:, : old.block_size] = old.blocks.view(
                field.layer, field.kind
            )

    def mla(self, layer):
        return self._paged.mla(layer)

    def kda(self, layer):
        return self._paged.kda(layer)
