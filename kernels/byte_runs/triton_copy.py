"""Byte runs copied by a Triton kernel, with no per-byte index: runs are cut into pieces of at most
``PIECE`` elements and one program copies one piece, so a long run spreads over many programs and an
empty run launches none::

    runs    (src 0, dst 100, 10000 B)          (src 9000, dst 0, 5 B)
    pieces  (0, 100, 4096) (4096, 4196, 4096) (8192, 8292, 1808) (9000, 0, 5)   one program each

When every offset and length is a multiple of 16 and both buffers start 16-byte aligned, the
buffers are read as int32 words with offsets hinted as multiples of 4 words: 16-byte vector loads and
stores on CUDA. Otherwise bytes, one lane each.

Same signature and result as ``kernels.byte_runs.naive.copy_byte_runs``.
"""

import torch
import triton
import triton.language as tl

from kernels.triton_env import require_triton_device

PIECE = 4096  # elements one program copies at most
_BLOCK = 1024  # elements per vector of a program's loop
_VECTOR_BYTES = 16


@triton.jit
def _copy_pieces_kernel(
    source,
    dest,
    piece_source,
    piece_dest,
    piece_length,
    PIECE: tl.constexpr,
    BLOCK: tl.constexpr,
    WORDS_PER_VECTOR: tl.constexpr,
):
    piece = tl.program_id(0)
    src = tl.load(piece_source + piece)
    dst = tl.load(piece_dest + piece)
    length = tl.load(piece_length + piece)
    if WORDS_PER_VECTOR > 1:  # the launcher checked it: offsets are whole vectors
        src = tl.multiple_of(src, WORDS_PER_VECTOR)
        dst = tl.multiple_of(dst, WORDS_PER_VECTOR)
    lanes = tl.arange(0, BLOCK)
    for start in range(0, PIECE, BLOCK):
        at = start + lanes
        inside = at < length
        values = tl.load(source + src + at, mask=inside)
        tl.store(dest + dst + at, values, mask=inside)


def copy_byte_runs(
    source: torch.Tensor,
    source_offsets: torch.Tensor,
    dest: torch.Tensor,
    dest_offsets: torch.Tensor,
    nbytes: torch.Tensor,
) -> None:
    """``dest[dest_offsets[i] : + nbytes[i]] = source[source_offsets[i] : + nbytes[i]]`` for every run.

    Args:
        source: ``[S]`` uint8, contiguous (CUDA, or CPU under the Triton interpreter).
        source_offsets, dest_offsets, nbytes: ``[R]`` int64 on the CPU (a plan's run table); runs may be
            empty; the destination ranges must not overlap each other.
        dest: ``[D]`` uint8, contiguous, on ``source``'s device; written in place.
    """
    require_triton_device("copy_byte_runs", source, dest)
    if source.dtype != torch.uint8 or dest.dtype != torch.uint8:
        raise ValueError(f"copy_byte_runs: uint8 buffers expected, got {source.dtype} and {dest.dtype}")
    keep = nbytes > 0
    source_offsets, dest_offsets, nbytes = source_offsets[keep], dest_offsets[keep], nbytes[keep]
    if not len(nbytes):
        return
    unit = 1
    if _vector_aligned(source, dest, source_offsets, dest_offsets, nbytes):
        unit, source, dest = 4, source.view(torch.int32), dest.view(torch.int32)
    pieces = _pieces(source_offsets // unit, dest_offsets // unit, nbytes // unit)
    table = torch.stack(pieces).to(source.device)
    words_per_vector = _VECTOR_BYTES // unit if unit > 1 else 1
    _copy_pieces_kernel[(table.shape[1],)](
        source, dest, *table, PIECE=PIECE, BLOCK=_BLOCK, WORDS_PER_VECTOR=words_per_vector
    )


def _vector_aligned(source, dest, *runs: torch.Tensor) -> bool:
    """Whether the copy can move whole 16-byte vectors of int32 words."""
    buffers = all(t.data_ptr() % _VECTOR_BYTES == 0 and t.numel() % 4 == 0 for t in (source, dest))
    return buffers and all(bool((column % _VECTOR_BYTES == 0).all()) for column in runs)


def _pieces(
    source_offsets: torch.Tensor, dest_offsets: torch.Tensor, lengths: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Non-empty runs cut into pieces of at most ``PIECE`` elements: ``(source, dest, length)``, int64."""
    counts = -(-lengths // PIECE)
    run = torch.repeat_interleave(torch.arange(len(lengths)), counts)
    first = torch.cumsum(counts, 0) - counts
    skip = (torch.arange(len(run)) - first[run]) * PIECE  # where the piece starts inside its run
    return source_offsets[run] + skip, dest_offsets[run] + skip, torch.clamp(lengths[run] - skip, max=PIECE)
