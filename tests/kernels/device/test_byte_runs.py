"""Byte runs copied into a buffer: the Triton kernel (on CUDA, else under the interpreter) against the
torch reference, bitwise, and the reference against a plain slice loop: ragged and long runs (several pieces),
unaligned offsets, empty runs, whole 16-byte vectors (the word path)."""

import pytest
import torch

from kernels.byte_runs import naive, triton_copy

SOURCE_BYTES, DEST_BYTES = 20_000, 24_000


def runs_of(lengths: list[int], align: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Runs of ``lengths`` at random ``align``-multiple source offsets, packed (in a shuffled order, with
    gaps) into disjoint destination ranges."""
    generator = torch.Generator().manual_seed(seed)
    nbytes = torch.tensor(lengths, dtype=torch.int64)
    source = torch.randint(0, (SOURCE_BYTES - max(lengths)) // align, (len(lengths),), generator=generator)
    order = torch.randperm(len(lengths), generator=generator)
    dest, at = torch.zeros(len(lengths), dtype=torch.int64), 0
    for i in order.tolist():
        dest[i] = at
        at += -(-(lengths[i] + align) // align) * align  # a gap of at least one unit after each run
    assert at <= DEST_BYTES
    return source * align, dest, nbytes


CASES = {
    "ragged-unaligned": ([1, 7, 300, 5000, 13, 2], 1),
    "empty-runs": ([0, 9, 0, 0, 4097, 0], 1),
    "long-run-pieces": ([9000, 3], 3),
    "whole-vectors": ([16, 4096, 8192, 48, 1008], 16),
    "only-empty": ([0, 0], 1),
}


@pytest.mark.parametrize("lengths, align", CASES.values(), ids=CASES.keys())
def test_the_kernel_copies_what_the_reference_copies_bitwise(lengths, align):
    source = torch.randint(
        0, 256, (SOURCE_BYTES,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)
    )
    source_offsets, dest_offsets, nbytes = runs_of(lengths, align, seed=len(lengths))
    fill = torch.full((DEST_BYTES,), 0xA5, dtype=torch.uint8)  # bytes no run writes must stay as they were
    want, got = fill.clone(), fill.clone()
    for s, d, n in zip(source_offsets.tolist(), dest_offsets.tolist(), nbytes.tolist(), strict=True):
        want[d : d + n] = source[s : s + n]
    reference = fill.clone()
    naive.copy_byte_runs(source, source_offsets, reference, dest_offsets, nbytes)
    assert torch.equal(reference, want)
    triton_copy.copy_byte_runs(source, source_offsets, got, dest_offsets, nbytes)
    assert torch.equal(got, want)
    vector = triton_copy._vector_aligned(source, got, source_offsets, dest_offsets, nbytes)
    assert vector == (align == 16), "whole vectors take the word path, anything else bytes"


def test_runs_are_cut_into_pieces_of_at_most_one_program():
    source, dest, lengths = (torch.tensor(v) for v in ([0, 50_000], [100, 0], [10_000, 5]))
    pieces = triton_copy._pieces(source, dest, lengths)
    piece = triton_copy.PIECE
    assert [p.tolist() for p in pieces] == [
        [0, piece, 2 * piece, 50_000],
        [100, 100 + piece, 100 + 2 * piece, 0],
        [piece, piece, 10_000 - 2 * piece, 5],
    ]


def test_the_kernel_refuses_buffers_that_are_not_bytes():
    words = torch.zeros(8, dtype=torch.int32)
    runs = torch.tensor([0]), torch.tensor([0]), torch.tensor([4])
    with pytest.raises(ValueError, match="uint8 buffers expected"):
        triton_copy.copy_byte_runs(words, runs[0], words, runs[1], runs[2])
