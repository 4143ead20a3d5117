"""``ModelCache`` over the block pool and the state-slot pool: per-layer views the kernels index."""

import torch

from services.engine.model.config import ModelConfig
from services.engine.model.layer_cache import KdaLayerCache, MlaLayerCache

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


class PagedModelCache:
    """The pools as every layer's ``MlaLayerCache`` / ``KdaLayerCache`` (views, built once).

    Which sequence owns which blocks and slot is the step's business (``StepMetadata``), so one
    instance serves every step of an engine.

    Args:
        blocks: the packed MLA block pool.
        slots: the KDA state-slot pool.
        model_config: the model's sizes (to unpack FP8 blocks).
        dtype: the model's compute dtype (what FP8 rows dequantise to).
    """

    def __init__(
        self, blocks: BlockPool, slots: StateSlotPool, model_config: ModelConfig, dtype: torch.dtype
    ):
        self.blocks = blocks
        self.slots = slots
        self.model_config = model_config
        self.dtype = dtype
        self._mla: dict[int, MlaLayerCache] = {}
        self._kda: dict[int, KdaLayerCache] = {}

    @property
    def block_size(self) -> int:
        return self.blocks.block_size

    def mla(self, layer: int) -> MlaLayerCache:
        if layer not in self._mla:
            self._mla[layer] = self._mla_view(layer)
        return self._mla[layer]

    def kda(self, layer: int) -> KdaLayerCache:
        if layer not in self._kda:
            self._kda[layer] = self._kda_view(layer)
        return self._kda[layer]

    def _mla_view(self, layer: int) -> MlaLayerCache:
        layout, config = self.blocks.layout, self.model_config

        def view(kind: str) -> torch.Tensor | None:
            return self.blocks.view(layer, kind) if layout.has(layer, kind) else None

        return MlaLayerCache(
            latent=view(LATENT),
            k_rope=view(K_ROPE),
            index_key=view(INDEX_KEY),
            latent_fp8=view(LATENT_FP8),
            index_key_fp8=view(INDEX_KEY_FP8),
            dtype=self.dtype,
            latent_dim=config.kv_lora_rank,
            rope_dim=config.qk_rope_head_dim,
            index_dim=config.indexer.head_dim if config.indexer else 0,
        )

    def _kda_view(self, layer: int) -> KdaLayerCache:
        view = self.slots.view
        open_rows = {}
        if self.slots.layout.has(layer, OPEN_COUNT):
            open_rows = {
                "open_k": view(layer, OPEN_K),
                "open_g": view(layer, OPEN_G),
                "open_delta": view(layer, OPEN_DELTA),
                "open_count": view(layer, OPEN_COUNT),
            }
        return KdaLayerCache(recurrent=view(layer, RECURRENT), conv=view(layer, CONV), **open_rows)
