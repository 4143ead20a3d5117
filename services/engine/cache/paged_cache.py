"""``ModelCache`` over the block pool and state-slot pool for one forward step."""

from dataclasses import dataclass

import torch

from services.engine.model.state import KdaLayerState

from .block_pool import BlockPool
from .layout import CONV, INDEX_KEY, K_ROPE, LATENT, RECURRENT
from .state_pool import StateSlotPool


@dataclass(frozen=True)
class SequenceCacheRef:
    """Where one sequence's cache lives: its block table, its state slot, its cached length."""

    block_table: tuple[int, ...]
    slot: int
    past: int


class PagedModelCache:
    """Reads and writes the sequences of one ``ForwardBatch`` (same order) in the pools.

    Args:
        blocks: the packed MLA block pool.
        slots: the KDA state-slot pool.
        sequences: per-sequence block tables (covering every position written this step) and slots.
    """

    def __init__(self, blocks: BlockPool, slots: StateSlotPool, sequences: list[SequenceCacheRef]):
        self.blocks = blocks
        self.slots = slots
        self.sequences = sequences
        self.lengths = [ref.past for ref in sequences]

    def _positions(self, seq: int, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        size = self.blocks.block_size
        positions = torch.arange(start, start + count)
        table = torch.tensor(self.sequences[seq].block_table, dtype=torch.long)
        return table[positions // size], positions % size

    def write_mla(self, layer, seq, latent, k_rope, index_keys):
        ref = self.sequences[seq]
        block_ids, offsets = self._positions(seq, ref.past, latent.shape[0])
        device = self.blocks.storage.device
        block_ids, offsets = block_ids.to(device), offsets.to(device)
        for kind, values in ((LATENT, latent), (K_ROPE, k_rope), (INDEX_KEY, index_keys)):
            if values is not None:
                view = self.blocks.view(layer, kind)
                view[block_ids, offsets] = values.to(view.dtype)
        self.lengths[seq] = ref.past + latent.shape[0]

    def read_mla(self, layer, seq):
        total = self.lengths[seq]
        count = -(-total // self.blocks.block_size)
        table = torch.tensor(
            self.sequences[seq].block_table[:count], dtype=torch.long, device=self.blocks.storage.device
        )

        def gather(kind: str) -> torch.Tensor:
            view = self.blocks.view(layer, kind)
            return view[table].reshape(-1, view.shape[-1])[:total]

        has_index = any(f.layer == layer and f.kind == INDEX_KEY for f in self.blocks.layout.fields)
        return gather(LATENT), gather(K_ROPE), gather(INDEX_KEY) if has_index else None

    def read_kda(self, layer, seq):
        ref = self.sequences[seq]
        if ref.past == 0:
            return None
        return KdaLayerState(
            conv=self.slots.view(layer, CONV)[ref.slot], recurrent=self.slots.view(layer, RECURRENT)[ref.slot]
        )

    def write_kda(self, layer, seq, state):
        slot = self.sequences[seq].slot
        conv = self.slots.view(layer, CONV)
        conv[slot] = state.conv.to(conv.dtype)
        self.slots.view(layer, RECURRENT)[slot] = state.recurrent
