"""Byte layouts of one packed block (MLA layers) and one state slot (KDA layers).

A block holds ``block_size`` tokens of every MLA layer's latent, rotary key part and DSA index key;
a slot holds one request's state of every KDA layer. Each field is contiguous inside its block or
slot, at a 64-byte aligned offset::

    block:  | L2.latent [B, Dc] | L2.k_rope [B, Dr] | L2.index_key [B, Di] | L5.latent ... |
    slot:   | L0.recurrent [H, K, V] fp32 | L0.conv [3HK, kernel-1] | L1.recurrent ... |

Kernels view one field of every block at once (``[num_blocks, B, dim]``, strided), while the
allocator, prefix cache and transfer move whole blocks or slots as bytes.
"""

import hashlib
from dataclasses import dataclass

import torch

from kernels.fp8.naive import index_key_fp8_bytes, latent_fp8_bytes
from services.engine.model.config import LAYER_KDA, LAYER_MLA, ModelConfig

ALIGNMENT = 64

LATENT = "latent"
K_ROPE = "k_rope"
INDEX_KEY = "index_key"
LATENT_FP8 = "latent_fp8"  # latent + rope packed: e4m3 latent, fp32 group scales, bf16 rope
INDEX_KEY_FP8 = "index_key_fp8"  # e4m3 key + one fp32 scale
KV_FORMATS = ("auto", "fp8")
RECURRENT = "recurrent"
CONV = "conv"
OPEN_K = "open_k"
OPEN_G = "open_g"
OPEN_DELTA = "open_delta"
OPEN_COUNT = "open_count"


@dataclass(frozen=True)
class Field:
    """One (layer, kind) region: ``shape`` elements of ``dtype`` at ``offset`` bytes."""

    layer: int
    kind: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * self.dtype.itemsize


@dataclass(frozen=True)
class Layout:
    """Fields of one block or slot and its total size in bytes."""

    fields: tuple[Field, ...]
    nbytes: int

    def has(self, layer: int, kind: str) -> bool:
        return any(f.layer == layer and f.kind == kind for f in self.fields)

    def field(self, layer: int, kind: str) -> Field:
        for candidate in self.fields:
            if candidate.layer == layer and candidate.kind == kind:
                return candidate
        raise KeyError(f"no field {kind!r} for layer {layer}")

    def fingerprint(self) -> str:
        """A short stable id of this layout (16 hex digits of a SHA-256 over every field's layer,
        kind, dtype, shape and offset, and the total size): equal in two processes exactly when their
        rows mean the same bytes. Independent of the torch version's object identities."""
        parts = [
            f"{f.layer}:{f.kind}:{str(f.dtype).removeprefix('torch.')}:{list(f.shape)}@{f.offset}"
            for f in self.fields
        ]
        return hashlib.sha256(";".join([*parts, str(self.nbytes)]).encode()).hexdigest()[:16]


def _pack(entries: list[tuple[int, str, torch.dtype, tuple[int, ...]]]) -> Layout:
    fields, offset = [], 0
    for layer, kind, dtype, shape in entries:
        field = Field(layer, kind, dtype, shape, offset)
        fields.append(field)
        offset += -(-field.nbytes // ALIGNMENT) * ALIGNMENT
    return Layout(tuple(fields), max(offset, ALIGNMENT))


def block_layout(config: ModelConfig, block_size: int, dtype: torch.dtype, kv_format: str = "auto") -> Layout:
    """Layout of one block of ``block_size`` tokens for every MLA layer.

    ``kv_format`` ``auto`` stores the model dtype; ``fp8`` stores each token's latent and rope part
    packed in FlashMLA's FP8 layout (656 bytes for Dc = 512, Dr = 64) and its index key as e4m3 plus
    a float32 scale (132 bytes for Di = 128); see ``kernels.fp8.naive``.
    """
    if kv_format not in KV_FORMATS:
        raise ValueError(f"kv_format: {kv_format!r} is not supported ({', '.join(KV_FORMATS)})")
    entries = []
    for layer, kind in enumerate(config.layer_types):
        if kind != LAYER_MLA:
            continue
        if kv_format == "fp8":
            row = latent_fp8_bytes(config.kv_lora_rank, config.qk_rope_head_dim)
            entries.append((layer, LATENT_FP8, torch.uint8, (block_size, row)))
            if config.indexer is not None:
                row = index_key_fp8_bytes(config.indexer.head_dim)
                entries.append((layer, INDEX_KEY_FP8, torch.uint8, (block_size, row)))
            continue
        entries.append((layer, LATENT, dtype, (block_size, config.kv_lora_rank)))
        entries.append((layer, K_ROPE, dtype, (block_size, config.qk_rope_head_dim)))
        if config.indexer is not None:
            entries.append((layer, INDEX_KEY, dtype, (block_size, config.indexer.head_dim)))
    return _pack(entries)


def slot_layout(config: ModelConfig, dtype: torch.dtype, open_chunk_rows: int = 0, tp: int = 1) -> Layout:
    """Layout of one request's KDA state: float32 recurrent state and the short-conv tail.

    With ``open_chunk_rows = C`` (batch-invariant CF-BI mode) the recurrent state is the one at the
    last aligned chunk boundary, and the slot also keeps the open chunk's rows (keys, cumulative
    decays, corrections) and how many there are. Under TP (``tp`` ranks) a rank's slot holds its
    ``num_heads / tp`` heads.
    """
    entries = []
    if config.kda is not None:
        heads = config.kda.num_heads // tp
        dim, kernel = config.kda.head_dim, config.kda.conv_kernel_size
        for layer, kind in enumerate(config.layer_types):
            if kind != LAYER_KDA:
                continue
            entries.append((layer, RECURRENT, torch.float32, (heads, dim, dim)))
            entries.append((layer, CONV, dtype, (3 * heads * dim, kernel - 1)))
            if open_chunk_rows:
                for name in (OPEN_K, OPEN_G, OPEN_DELTA):
                    entries.append((layer, name, torch.float32, (open_chunk_rows, heads, dim)))
                entries.append((layer, OPEN_COUNT, torch.int32, (1,)))
    return _pack(entries)


def stage_layout(layout: Layout, layers: range) -> Layout:
    """``layout`` keeping only the fields of ``layers`` (a pipeline stage's pools), packed again."""
    return _pack([(f.layer, f.kind, f.dtype, f.shape) for f in layout.fields if f.layer in layers])
