"""What one layer sees of the cache: its pool views, written once per step through ``slot_mapping``.

``MlaLayerCache`` holds one MLA layer's fields across every block (``[num_blocks, B, dim]``, strided
views into the packed blocks); ``KdaLayerCache`` one KDA layer's fields across every state slot.
Kernels read them directly with the step's block tables and slot indices; the ``reference`` backend
gathers one sequence at a time (``gather``). ``ModelCache`` is what the model asks for them.
"""

from dataclasses import dataclass
from typing import Protocol

import torch

from kernels.fp8.naive import pack_index_key_fp8, pack_latent_fp8, unpack_index_key_fp8, unpack_latent_fp8


@dataclass(frozen=True)
class MlaLayerCache:
    """One MLA layer's cached tokens in every block.

    Either the model-dtype fields (``latent [nb, B, Dc]``, ``k_rope [nb, B, Dr]``, ``index_key
    [nb, B, Di]`` or None without an indexer) or the FP8 ones (``latent_fp8 [nb, B, 656]`` for
    Dc = 512, Dr = 64; ``index_key_fp8 [nb, B, Di + 4]`` or None) are set, never both.
    ``dtype`` is what FP8 rows dequantise to; ``latent_dim``, ``rope_dim``, ``index_dim`` the sizes.
    """

    latent: torch.Tensor | None
    k_rope: torch.Tensor | None
    index_key: torch.Tensor | None
    latent_fp8: torch.Tensor | None
    index_key_fp8: torch.Tensor | None
    dtype: torch.dtype
    latent_dim: int
    rope_dim: int
    index_dim: int

    @property
    def is_fp8(self) -> bool:
        return self.latent_fp8 is not None

    @property
    def index_cache(self) -> torch.Tensor | None:
        """The index-key field kernels read (model dtype or FP8 rows), None without an indexer."""
        return self.index_key_fp8 if self.is_fp8 else self.index_key

    def write(
        self,
        slot_mapping: torch.Tensor,
        latent: torch.Tensor,
        k_rope: torch.Tensor,
        index_keys: torch.Tensor | None,
    ) -> None:
        """Store the step's new rows: one scatter per field, row ``i`` at flat slot ``slot_mapping[i]``.

        Args:
            slot_mapping: ``[N] int64``, ``block * B + offset``.
            latent: ``[N, Dc]``; k_rope: ``[N, Dr]``; index_keys: ``[N, Di]`` or None.
        """
        if self.is_fp8:
            rows = {"latent_fp8": pack_latent_fp8(latent, k_rope)}
            if index_keys is not None:
                rows["index_key_fp8"] = pack_index_key_fp8(index_keys)
        else:
            rows = {"latent": latent, "k_rope": k_rope, "index_key": index_keys}
        block_size = self.block_size
        blocks, offsets = slot_mapping // block_size, slot_mapping % block_size
        for name, values in rows.items():
            view = getattr(self, name)
            if values is not None and view is not None:
                view[blocks, offsets] = values.to(view.dtype)

    @property
    def block_size(self) -> int:
        field = self.latent_fp8 if self.is_fp8 else self.latent
        return field.shape[1]

    def gather(
        self, block_table: tuple[int, ...], total: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One sequence's first ``total`` tokens, for the ``reference`` backend: ``(latent [S, Dc],
        k_rope [S, Dr], index_keys [S, Di] | None)`` in the model dtype (FP8 rows dequantised)."""
        field = self.latent_fp8 if self.is_fp8 else self.latent
        count = -(-total // self.block_size)
        table = torch.tensor(block_table[:count], dtype=torch.long, device=field.device)

        def rows(view: torch.Tensor) -> torch.Tensor:
            return view[table].reshape(-1, view.shape[-1])[:total]

        if self.is_fp8:
            packed = rows(self.latent_fp8)
            latent, k_rope = unpack_latent_fp8(packed, self.latent_dim, self.rope_dim, self.dtype)
            index = self.index_key_fp8
            keys = None if index is None else unpack_index_key_fp8(rows(index), self.index_dim, self.dtype)
            return latent, k_rope, keys
        return rows(self.latent), rows(self.k_rope), None if self.index_key is None else rows(self.index_key)


@dataclass(frozen=True)
class KdaLayerCache:
    """One KDA layer's state in every slot: ``recurrent [num_slots, H, K, V]`` float32 and
    ``conv [num_slots, 3 * H * K, kernel - 1]`` (the short conv's last inputs), both updated in place.

    In batch-invariant mode (CF-BI) ``recurrent`` is the state at the last aligned chunk boundary and
    the slot also keeps the open chunk's rows: ``open_k``, ``open_g`` ``[num_slots, C, H, K]``,
    ``open_delta [num_slots, C, H, V]`` float32 and ``open_count [num_slots, 1] int32``; else these
    are None.
    """

    recurrent: torch.Tensor
    conv: torch.Tensor
    open_k: torch.Tensor | None = None
    open_g: torch.Tensor | None = None
    open_delta: torch.Tensor | None = None
    open_count: torch.Tensor | None = None

    @property
    def has_open_rows(self) -> bool:
        return self.open_count is not None


class ModelCache(Protocol):
    """Per-layer views of the cache a step runs on.

    Implementations: the engine's ``PagedModelCache`` (the block and slot pools) and
    ``ContiguousCache`` (private pools for full-sequence forwards).
    """

    def mla(self, layer: int) -> MlaLayerCache:
        """The MLA layer ``layer``'s fields."""

    def kda(self, layer: int) -> KdaLayerCache:
        """The KDA layer ``layer``'s fields."""
