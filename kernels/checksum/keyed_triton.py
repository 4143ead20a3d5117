"""The keyed row checksum in one Triton launch: each program hashes one block of one row's pairs of
words (one splitmix64 output weighs both words of a pair), computing the weights in registers (no weight
tensor, no gather copy: each byte is read once), and writes its partial sum; the partials are summed mod
``2^64`` on the device. Same contract and bits as ``kernels.checksum.naive.keyed_rows_checksum``
(integer arithmetic: the order of the sums does not matter).

``keyed_spans_partials`` is ``naive.keyed_spans_checksum``'s launches: spans of whole pairs of words on
both sides (offset, address and length multiples of 8: nearly all of a handoff's) are cut on the host
into chunks of ``_BLOCK`` pairs and hashed a pair per lane, exactly as rows are (a pair's weight comes
from its address); the other spans are cut into chunks of ``_SPAN_BLOCK`` bytes, each byte weighed by its
address. One table copy to the device per launch, no sync.
"""

import torch
import triton
import triton.language as tl

from kernels.checksum import naive
from kernels.checksum.naive import GOLDEN, MIX1, MIX2, as_int64, check_alignment
from kernels.triton_env import require_triton_device

_BLOCK = 1024  # pairs of words per program
_SPAN_BLOCK = 2048  # bytes per program of a span checksum


@triton.jit
def _splitmix(index, key, GOLDEN_C: tl.constexpr, MIX1_C: tl.constexpr, MIX2_C: tl.constexpr):
    """splitmix64 of the uint64 ``index * golden + key`` (wrapping), elementwise."""
    z = index * GOLDEN_C + key.to(tl.uint64)
    z = (z ^ (z >> 30)) * MIX1_C
    z = (z ^ (z >> 27)) * MIX2_C
    return z ^ (z >> 31)


@triton.jit
def _weighed_pairs(pair, z):
    """Each uint64 pair of words, its low word weighed by ``z``'s low half, its high word by the high."""
    low = 0xFFFFFFFF
    return (pair & low) * (z & low) + (pair >> 32) * (z >> 32)


@triton.jit
def _piece(chunks, program, BLOCK: tl.constexpr):
    """Program ``program``'s piece of a span table ``[pieces, 3]`` (offset, address, length): its offset,
    address, the lanes and which of them it covers."""
    offset = tl.load(chunks + program * 3)
    address = tl.load(chunks + program * 3 + 1)
    at = tl.arange(0, BLOCK)
    return offset, address, at, at < tl.load(chunks + program * 3 + 2)


@triton.jit
def _keyed_rows_kernel(
    pairs,
    rows,
    partials,
    start_pair,
    key,
    pairs_per_row,
    stride_row,
    blocks_per_row,
    GOLDEN_C: tl.constexpr,
    MIX1_C: tl.constexpr,
    MIX2_C: tl.constexpr,
    BLOCK: tl.constexpr,
):
    program = tl.program_id(0)
    position = program // blocks_per_row
    offsets = (program % blocks_per_row) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < pairs_per_row
    row = tl.load(rows + position).to(tl.int64)
    pair = tl.load(pairs + row * stride_row + offsets, mask=mask, other=0).to(tl.uint64)
    index = (start_pair + position.to(tl.int64) * pairs_per_row + offsets).to(tl.uint64)
    hashed = _weighed_pairs(pair, _splitmix(index, key, GOLDEN_C, MIX1_C, MIX2_C))
    tl.store(partials + program, tl.sum(tl.where(mask, hashed, 0), axis=0))


def keyed_rows_checksum(storage: torch.Tensor, rows: torch.Tensor, start: int, key: int) -> int:
    """``kernels.checksum.naive.keyed_rows_checksum`` in one launch (same arguments and value).

    Raises:
        ValueError: rows whose byte length is not a multiple of 8, or an odd ``start``.
    """
    return int(keyed_rows_partials(storage, rows, start, key).sum()) & ((1 << 64) - 1)


def keyed_rows_partials(storage: torch.Tensor, rows: torch.Tensor, start: int, key: int) -> torch.Tensor:
    """The launch alone: int64 partial sums on the device whose sum mod ``2^64`` is the checksum (no
    host sync, so a caller hashing several storages syncs once).

    Raises:
        ValueError: rows whose byte length is not a multiple of 8, or an odd ``start``.
    """
    require_triton_device("keyed_rows_checksum", storage, rows)
    check_alignment(storage, start)
    pairs = storage.view(torch.int64)
    pairs_per_row = pairs.shape[1]
    blocks_per_row = triton.cdiv(pairs_per_row, _BLOCK)
    partials = torch.zeros(max(1, rows.numel() * blocks_per_row), dtype=torch.uint64, device=storage.device)
    if rows.numel():
        _keyed_rows_kernel[(rows.numel() * blocks_per_row,)](
            pairs,
            rows,
            partials,
            start // 2,
            as_int64(key),
            pairs_per_row,
            pairs.stride(0),
            blocks_per_row,
            GOLDEN_C=GOLDEN,
            MIX1_C=MIX1,
            MIX2_C=MIX2,
            BLOCK=_BLOCK,
        )
    return partials.view(torch.int64)


@triton.jit
def _keyed_pair_spans_kernel(
    pairs,
    chunks,
    partials,
    key,
    GOLDEN_C: tl.constexpr,
    MIX1_C: tl.constexpr,
    MIX2_C: tl.constexpr,
    BLOCK: tl.constexpr,
):
    program = tl.program_id(0).to(tl.int64)
    offset, address, at, mask = _piece(chunks, program, BLOCK)
    pair = tl.load(pairs + offset + at, mask=mask, other=0).to(tl.uint64)
    hashed = _weighed_pairs(pair, _splitmix((address + at).to(tl.uint64), key, GOLDEN_C, MIX1_C, MIX2_C))
    tl.store(partials + program, tl.sum(tl.where(mask, hashed, 0), axis=0))


@triton.jit
def _keyed_spans_kernel(
    source,
    chunks,
    partials,
    key,
    GOLDEN_C: tl.constexpr,
    MIX1_C: tl.constexpr,
    MIX2_C: tl.constexpr,
    BLOCK: tl.constexpr,
):
    program = tl.program_id(0).to(tl.int64)
    offset, address, at, mask = _piece(chunks, program, BLOCK)
    byte = tl.load(source + offset + at, mask=mask, other=0).to(tl.uint64)
    where = (address + at).to(tl.uint64)
    word = where >> 2
    z = _splitmix(word >> 1, key, GOLDEN_C, MIX1_C, MIX2_C)
    weight = tl.where((word & 1) == 1, z >> 32, z & 0xFFFFFFFF)
    hashed = (byte << ((where & 3) * 8)) * weight
    tl.store(partials + program, tl.sum(tl.where(mask, hashed, 0), axis=0))


def keyed_spans_partials(
    source: torch.Tensor, offsets: torch.Tensor, addresses: torch.Tensor, nbytes: torch.Tensor, key: int
) -> torch.Tensor:
    """``naive.keyed_spans_checksum`` in at most two launches, without the host sync: int64 partial sums
    on the device whose sum mod ``2^64`` is the checksum (same arguments; the span table on the CPU)."""
    require_triton_device("keyed_spans_checksum", source)
    whole = (offsets | addresses | nbytes).bitwise_and(7) == 0
    if source.storage_offset() % 8:
        whole[:] = False
    parts = [torch.zeros(1, dtype=torch.uint64, device=source.device)]
    if bool(whole.any()):
        pairs = source[: source.numel() // 8 * 8].view(torch.int64)
        spans = (offsets[whole] >> 3, addresses[whole] >> 3, nbytes[whole] >> 3)
        parts.append(_launch(_keyed_pair_spans_kernel, pairs, spans, key, _BLOCK))
    if not bool(whole.all()):
        spans = (offsets[~whole], addresses[~whole], nbytes[~whole])
        parts.append(_launch(_keyed_spans_kernel, source, spans, key, _SPAN_BLOCK))
    return torch.cat(parts).view(torch.int64)


def _launch(kernel, source: torch.Tensor, spans: tuple, key: int, block: int) -> torch.Tensor:
    """One program per piece of at most ``block`` elements of the spans (``(offsets, addresses,
    lengths)`` in ``source``'s elements): the pieces' partial sums."""
    table = torch.stack(naive.cut_spans(*spans, block, source.device), 1)
    partials = torch.zeros(len(table), dtype=torch.uint64, device=source.device)
    if len(table):
        kernel[(len(table),)](
            source,
            table,
            partials,
            as_int64(key),
            GOLDEN_C=GOLDEN,
            MIX1_C=MIX1,
            MIX2_C=MIX2,
            BLOCK=block,
        )
    return partials
