"""``TrainingCache``: the ``ModelCache`` of one trainer forward, kept as autograd tensors.

The serving caches write a step's rows into shared pools in place (``MlaLayerCache.write``, the KDA
state slots) and read them back by block table. Autograd can follow that, but it makes every pool
write a node whose backward copies the whole pool. The trainer runs each trajectory as one fresh
sequence in one step, so it needs neither: an MLA layer keeps the step's rows as the tensors the
layer computed and ``gather`` returns a sequence's slice of them (the same values the pools would
return, so the attention sees the same bits); a KDA layer never reads state back (no trajectory
has a past), so its state writes are dropped.
"""

import torch

from services.engine.model.layer_cache import KdaLayerCache


class _MlaRows:
    """One MLA layer's rows of the step, in packed order (duck-types ``MlaLayerCache``)."""

    def __init__(self, cu_seqlens: tuple[int, ...], dtype: torch.dtype):
        self.cu_seqlens, self.dtype = cu_seqlens, dtype
        self.latent = self.k_rope = self.index_keys = None

    def write(self, slot_mapping, latent, k_rope, index_keys) -> None:
        """Keep the step's rows (``slot_mapping`` is the trainer's: block ``i`` is sequence ``i``)."""
        if self.latent is not None:
            raise RuntimeError("TrainingCache holds one step; this layer was written already")
        self.latent, self.k_rope = latent.to(self.dtype), k_rope.to(self.dtype)
        self.index_keys = None if index_keys is None else index_keys.to(self.dtype)

    def gather(self, block_table: tuple[int, ...], total: int):
        """Sequence ``block_table[0]``'s first ``total`` rows: ``(latent, k_rope, index_keys | None)``."""
        start = self.cu_seqlens[block_table[0]]
        rows = slice(start, start + total)
        keys = None if self.index_keys is None else self.index_keys[rows]
        return self.latent[rows], self.k_rope[rows], keys


class _Dropped:
    """A state field nobody reads back: writes vanish, a read is a bug."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype  # the backend casts what it writes to the field's dtype

    def __setitem__(self, index, value) -> None:
        pass

    def __getitem__(self, index):
        raise RuntimeError("TrainingCache: KDA state is never read back (every trajectory starts fresh)")


class TrainingCache:
    """Per-layer views for one packed step of fresh sequences (sequence ``i`` is block ``i``, slot ``i``).

    Args:
        cu_seqlens: the packed batch's boundaries.
        dtype: the model's compute dtype (what the serving cache stores rows in).
    """

    def __init__(self, cu_seqlens: tuple[int, ...], dtype: torch.dtype):
        self.cu_seqlens, self.dtype = cu_seqlens, dtype
        self._mla: dict[int, _MlaRows] = {}
        dropped = _Dropped(dtype)
        self._kda = KdaLayerCache(dropped, dropped, dropped, dropped, dropped, dropped)

    def mla(self, layer: int) -> _MlaRows:
        if layer not in self._mla:
            self._mla[layer] = _MlaRows(self.cu_seqlens, self.dtype)
        return self._mla[layer]

    def kda(self, layer: int) -> KdaLayerCache:
        return self._kda
