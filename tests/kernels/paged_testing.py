"""Builders for the paged-kernel tests: block storage laid out like ``BlockPool``, ragged steps."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.fp8.naive import (
    index_key_fp8_bytes,
    latent_fp8_bytes,
    pack_index_key_fp8,
    pack_latent_fp8,
    unpack_index_key_fp8,
    unpack_latent_fp8,
)

ALIGN = 64


@dataclass
class PagedCache:
    """One layer's fields over shuffled blocks, and each sequence's logical rows (for references)."""

    latent: torch.Tensor  # [num_blocks, B, Dc] or [num_blocks, B, row] uint8 (fp8)
    rope: torch.Tensor | None  # [num_blocks, B, Dr] or None (fp8)
    index_key: torch.Tensor  # [num_blocks, B, Di] or [num_blocks, B, Di + 4] uint8 (fp8)
    block_tables: torch.Tensor  # [S, max_blocks] int32
    rows_latent: list[torch.Tensor]  # per sequence [len, Dc] float32 (dequantised when fp8)
    rows_rope: list[torch.Tensor]
    rows_index: list[torch.Tensor]


def _carve(storage: torch.Tensor, offset: int, block: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    nbytes = block * width * dtype.itemsize
    return storage[:, offset : offset + nbytes].view(dtype).view(storage.shape[0], block, width)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def build_cache(
    lengths: list[int],
    block: int,
    dims: tuple[int, int, int],
    dtype: torch.dtype,
    fp8: bool,
    device: str = "cpu",
    spare_blocks: int = 3,
    values=None,
) -> PagedCache:
    """Random rows for sequences of ``lengths`` in one storage of interleaved fields (as a packed block).

    ``values(n, dim) -> tensor`` makes the row values (default: standard normal).
    """
    latent_dim, rope_dim, index_dim = dims
    values = values or (lambda n, d: torch.randn(n, d))
    per_seq = [-(-n // block) for n in lengths]
    num_blocks = sum(per_seq) + spare_blocks
    if fp8:
        widths = [
            (latent_fp8_bytes(latent_dim, rope_dim), torch.uint8),
            (index_key_fp8_bytes(index_dim), torch.uint8),
        ]
    else:
        widths = [(latent_dim, dtype), (rope_dim, dtype), (index_dim, dtype)]
    offsets, total = [], 0
    for width, dt in widths:
        offsets.append(total)
        total += _aligned(block * width * dt.itemsize)
    storage = torch.zeros(num_blocks, total, dtype=torch.uint8, device=device)
    views = [_carve(storage, off, block, w, dt) for off, (w, dt) in zip(offsets, widths, strict=True)]
    order = torch.randperm(num_blocks).tolist()
    max_blocks = max(per_seq) + 1
    tables = torch.zeros(len(lengths), max_blocks, dtype=torch.int32)
    rows_latent, rows_rope, rows_index = [], [], []
    for s, n in enumerate(lengths):
        ids = [order.pop() for _ in range(per_seq[s])]
        tables[s, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
        latent, rope, index = values(n, latent_dim), values(n, rope_dim), values(n, index_dim)
        pos = torch.arange(n)
        blk, row = torch.tensor(ids, dtype=torch.long)[pos // block], pos % block
        if fp8:
            packed = pack_latent_fp8(latent, rope)
            packed_index = pack_index_key_fp8(index)
            views[0][blk, row] = packed.to(device)
            views[1][blk, row] = packed_index.to(device)
            latent, rope = unpack_latent_fp8(packed, latent_dim, rope_dim)
            index = unpack_index_key_fp8(packed_index, index_dim)
        else:
            latent, rope, index = latent.to(dtype), rope.to(dtype), index.to(dtype)
            views[0][blk, row] = latent.to(device)
            views[1][blk, row] = rope.to(device)
            views[2][blk, row] = index.to(device)
        rows_latent.append(latent.float())
        rows_rope.append(rope.float())
        rows_index.append(index.float())
    if fp8:
        return PagedCache(views[0], None, views[1], tables.to(device), rows_latent, rows_rope, rows_index)
    return PagedCache(views[0], views[1], views[2], tables.to(device), rows_latent, rows_rope, rows_index)


def step_queries(
    pieces: list[tuple[int, int, int]], device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``pieces`` of ``(seq, first position, count)`` -> ``(query_seq [T], query_pos [T])`` int32."""
    seqs, poss = [], []
    for seq, first, count in pieces:
        seqs += [seq] * count
        poss += list(range(first, first + count))
    as_tensor = lambda v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
    return as_tensor(seqs), as_tensor(poss)


def random_topk(query_pos: torch.Tensor, k: int, seed: int = 0) -> torch.Tensor:
    """``[T, k]`` int32: a random subset of each query's visible positions, unsorted, -1 padded."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for pos in query_pos.tolist():
        chosen = torch.randperm(pos + 1, generator=gen)[: min(k, pos + 1)]
        rows.append(torch.cat([chosen, torch.full((k - chosen.numel(),), -1)]))
    out = torch.stack(rows).to(torch.int32)
    # scatter the -1 entries among the valid ones, so the kernel cannot rely on a -1 tail
    perm = torch.randperm(k, generator=gen)
    return out[:, perm].to(query_pos.device)
