"""``ModelCache`` over the block pool and state-slot pool for one forward step."""

from dataclasses import dataclass

import torch

from kernels.fp8.naive import pack_index_key_fp8, pack_latent_fp8, unpack_index_key_fp8, unpack_latent_fp8
from kernels.kda.fixed_chunk import FixedChunkState
from services.engine.model.config import ModelConfig
from services.engine.model.state import KdaLayerState

from .block_pool import BlockPool
from .layout import (
    CONV,
    INDEX_KEY,
    INDEX_KEY_FP8,
    K_ROPE,
    LATENT,
    LATENT_FP8,
    OPEN_COUNT,
    OPEN_DELTA,
    OPEN_G,
    OPEN_K,
    RECURRENT,
)
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
        model_config: the model's sizes (to unpack FP8 blocks).
        dtype: the model's compute dtype.
    """

    def __init__(
        self,
        blocks: BlockPool,
        slots: StateSlotPool,
        sequences: list[SequenceCacheRef],
        model_config: ModelConfig,
        dtype: torch.dtype,
    ):
        self.model_config = model_config
        self.dtype = dtype  # what FP8 blocks are dequantised to
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
        layout = self.blocks.layout
        if layout.has(layer, LATENT_FP8):
            rows = {LATENT_FP8: pack_latent_fp8(latent, k_rope)}
            if index_keys is not None:
                rows[INDEX_KEY_FP8] = pack_index_key_fp8(index_keys)
        else:
            rows = {LATENT: latent, K_ROPE: k_rope, INDEX_KEY: index_keys}
        for kind, values in rows.items():
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

        layout, config = self.blocks.layout, self.model_config
        if layout.has(layer, LATENT_FP8):
            latent, k_rope = unpack_latent_fp8(
                gather(LATENT_FP8), config.kv_lora_rank, config.qk_rope_head_dim, self.dtype
            )
            index_keys = None
            if layout.has(layer, INDEX_KEY_FP8):
                index_keys = unpack_index_key_fp8(gather(INDEX_KEY_FP8), config.indexer.head_dim, self.dtype)
            return latent, k_rope, index_keys
        has_index = layout.has(layer, INDEX_KEY)
        return gather(LATENT), gather(K_ROPE), gather(INDEX_KEY) if has_index else None

    def _has_open_rows(self, layer: int) -> bool:
        return self.slots.layout.has(layer, OPEN_COUNT)

    def read_kda(self, layer, seq):
        ref = self.sequences[seq]
        if ref.past == 0:
            return None
        view = self.slots.view
        recurrent = view(layer, RECURRENT)[ref.slot]
        if self._has_open_rows(layer):
            recurrent = FixedChunkState(
                s0=recurrent.clone(),
                open_k=view(layer, OPEN_K)[ref.slot].clone(),
                open_g=view(layer, OPEN_G)[ref.slot].clone(),
                open_delta=view(layer, OPEN_DELTA)[ref.slot].clone(),
                count=int(view(layer, OPEN_COUNT)[ref.slot][0]),
            )
        return KdaLayerState(conv=view(layer, CONV)[ref.slot], recurrent=recurrent)

    def write_kda(self, layer, seq, state):
        slot = self.sequences[seq].slot
        view = self.slots.view
        conv = view(layer, CONV)
        conv[slot] = state.conv.to(conv.dtype)
        if isinstance(state.recurrent, FixedChunkState):
            chunk = state.recurrent
            view(layer, RECURRENT)[slot] = chunk.s0
            view(layer, OPEN_K)[slot] = chunk.open_k
            view(layer, OPEN_G)[slot] = chunk.open_g
            view(layer, OPEN_DELTA)[slot] = chunk.open_delta
            view(layer, OPEN_COUNT)[slot] = chunk.count
        else:
            view(layer, RECURRENT)[slot] = state.recurrent
