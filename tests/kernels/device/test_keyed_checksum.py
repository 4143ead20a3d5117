"""The keyed row checksum: the Triton kernel (CUDA, or the CPU under the interpreter) gives the
reference's value exactly (integer arithmetic), for rows in any order, several blocks per row, a ragged
last block, keys of both signs; the reference sees a bit flip, swapped words (inside a pair and across
two), the top bits of two words and a change in each half of a pair that would cancel under equal
weights, and its slices equal one pass; misaligned rows or starts are refused."""

import pytest
import torch

from kernels.checksum import keyed_triton, naive

KEYS = [0x0123456789ABCDEF, 0xF123456789ABCDEF, 7]


def _storage(rows: int, row_bytes: int, device: str, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (rows, row_bytes), dtype=torch.uint8, generator=g).to(device)


@pytest.mark.parametrize("row_bytes", [64, 2050 * 8], ids=["one-block", "ragged-blocks"])
@pytest.mark.parametrize("key", KEYS, ids=["key", "high-bit-key", "small-key"])
def test_triton_equals_the_reference(row_bytes, key, device):
    storage = _storage(9, row_bytes, device)
    rows = torch.tensor([5, 0, 8, 3], dtype=torch.int64, device=device)
    want = naive.keyed_rows_checksum(storage.cpu(), rows.cpu(), 18, key)
    assert keyed_triton.keyed_rows_checksum(storage, rows, 18, key) == want
    assert keyed_triton.keyed_rows_checksum(storage, rows[:0], 18, key) == 0
    with pytest.raises(ValueError, match="odd"):
        keyed_triton.keyed_rows_checksum(storage, rows, 17, key)


def test_the_reference_sees_every_kind_of_change(monkeypatch):
    storage = _storage(4, 256, "cpu", seed=1)
    rows = torch.arange(4)
    base = naive.keyed_rows_checksum(storage, rows, 0, KEYS[0])
    assert 0 <= base < 1 << 64
    flipped = storage.clone()
    flipped[2, 100] ^= 1
    across = storage.clone().view(torch.int32)
    across[1, [3, 4]] = across[1, [4, 3]]  # the high word of one pair, the low word of the next
    inside = storage.clone().view(torch.int32)
    assert inside[1, 4] != inside[1, 5]
    inside[1, [4, 5]] = inside[1, [5, 4]]  # the two words of one pair
    top = storage.clone().view(torch.int32)
    top[0, [10, 20]] ^= torch.tensor(-(1 << 31), dtype=torch.int32)  # bit 31 of two words
    halves = storage.clone().view(torch.int32)
    halves[3, 6] += 1
    halves[3, 7] -= 1  # +1 and -1 in the two halves of one pair
    for changed in (flipped, across, inside, top, halves):
        changed = changed.view(torch.uint8)
        assert naive.keyed_rows_checksum(changed, rows, 0, KEYS[0]) != base
    assert naive.keyed_rows_checksum(storage, rows, 0, KEYS[1]) != base
    assert naive.keyed_rows_checksum(storage, rows.flip(0), 0, KEYS[0]) != base  # row order counts
    first = naive.keyed_rows_checksum(storage, rows[:1], 0, KEYS[0])
    rest = naive.keyed_rows_checksum(storage, rows[1:], 64, KEYS[0])  # 64 words a row
    assert (first + rest) % (1 << 64) == base
    monkeypatch.setattr(naive, "SLICE_WORDS", 100)
    assert naive.keyed_rows_checksum(storage, rows, 0, KEYS[0]) == base
    with pytest.raises(ValueError, match="64-bit words"):
        naive.keyed_rows_checksum(storage[:, :12], rows, 0, KEYS[0])


def _spans(total: int, seed: int) -> tuple[torch.Tensor, ...]:
    """``(offsets, addresses, nbytes)``: ``total`` bytes cut at random points (some empty spans), each
    span at its own address (sources in order, addresses shuffled by region)."""
    g = torch.Generator().manual_seed(seed)
    cuts = torch.sort(torch.randint(0, total + 1, (40,), generator=g)).values
    cuts = torch.cat([torch.tensor([0]), cuts, torch.tensor([total])])
    return cuts[:-1], cuts[:-1] + (5 << 42), torch.diff(cuts)


@pytest.mark.parametrize("key", KEYS, ids=["key", "high-bit-key", "small-key"])
def test_span_checksum_triton_equals_the_reference(key, device):
    source = _storage(1, 3 * 2048 + 37, device).view(-1)
    offsets, addresses, nbytes = _spans(source.numel(), seed=2)
    addresses = addresses + torch.randint(
        0, 1 << 30, addresses.shape, generator=torch.Generator().manual_seed(3)
    )
    want = naive.keyed_spans_checksum(source.cpu(), offsets, addresses, nbytes, key)
    got = int(keyed_triton.keyed_spans_partials(source, offsets, addresses, nbytes, key).sum()) & (
        (1 << 64) - 1
    )
    assert got == want
    empty = keyed_triton.keyed_spans_partials(source, offsets[:0], addresses[:0], nbytes[:0], key)
    assert int(empty.sum()) == 0


@pytest.mark.parametrize("ragged", [False, True], ids=["pairs-only", "pairs-and-bytes"])
def test_pair_spans_take_the_pair_launch(ragged, device, monkeypatch):
    """Spans of whole pairs on both sides (several blocks long) are hashed a pair per lane, the others
    byte by byte beside them; the sum is the reference's either way."""
    source = _storage(1, 6 * keyed_triton._BLOCK * 8 + 64, device).view(-1)
    g = torch.Generator().manual_seed(4)
    cuts = torch.sort(torch.randint(0, source.numel() // 8, (12,), generator=g)).values * 8
    cuts = torch.cat([torch.tensor([0]), cuts, torch.tensor([source.numel()])])
    offsets, nbytes = cuts[:-1], torch.diff(cuts)
    addresses = torch.randperm(len(offsets), generator=g) * (8 << 20) + (3 << 40)
    if ragged:
        addresses[::3] += 5  # every third span lands off a word boundary
    launched = []
    real_launch = keyed_triton._launch
    monkeypatch.setattr(
        keyed_triton, "_launch", lambda kernel, *rest: launched.append(kernel) or real_launch(kernel, *rest)
    )
    want = naive.keyed_spans_checksum(source.cpu(), offsets, addresses, nbytes, KEYS[1])
    got = int(keyed_triton.keyed_spans_partials(source, offsets, addresses, nbytes, KEYS[1]).sum())
    assert got & ((1 << 64) - 1) == want
    pair, byte = keyed_triton._keyed_pair_spans_kernel, keyed_triton._keyed_spans_kernel
    assert launched == ([pair, byte] if ragged else [pair])


def test_span_checksum_is_the_row_checksum_of_the_bytes_it_places(monkeypatch):
    """Whole rows placed at word ``4 start`` hash as the row checksum numbered from ``start``, however the
    bytes are split into spans (two senders writing halves of one word) and in whatever order."""
    storage = _storage(6, 256, "cpu", seed=4)
    flat = storage.view(-1)
    rows = torch.arange(6)
    want = naive.keyed_rows_checksum(storage, rows, 18, KEYS[0])
    offsets, _, nbytes = _spans(flat.numel(), seed=5)
    assert naive.keyed_spans_checksum(flat, offsets, offsets + 18 * 4, nbytes, KEYS[0]) == want
    order = torch.randperm(len(offsets), generator=torch.Generator().manual_seed(6))
    assert (
        naive.keyed_spans_checksum(flat, offsets[order], offsets[order] + 72, nbytes[order], KEYS[0]) == want
    )
    monkeypatch.setattr(naive, "SLICE_WORDS", 7)  # slices cut through spans
    assert naive.keyed_spans_checksum(flat, offsets, offsets + 72, nbytes, KEYS[0]) == want
    # Cuts on word boundaries: those spans are read a word at a time, beside the bytewise ones.
    words = torch.unique(torch.cat([offsets // 4 * 4, torch.tensor([flat.numel()])]))
    aligned, sizes = words[:-1], torch.diff(words)
    assert naive.keyed_spans_checksum(flat, aligned, aligned + 72, sizes, KEYS[0]) == want
    mixed = torch.cat([aligned[:5], offsets[offsets >= aligned[5]]])
    sizes = torch.diff(torch.cat([mixed, torch.tensor([flat.numel()])]))
    assert naive.keyed_spans_checksum(flat, mixed, mixed + 72, sizes, KEYS[0]) == want


def test_span_checksum_sees_a_changed_byte_a_moved_span_and_another_key():
    flat = _storage(1, 4096, "cpu", seed=7).view(-1)
    offsets, addresses, nbytes = _spans(flat.numel(), seed=8)
    base = naive.keyed_spans_checksum(flat, offsets, addresses, nbytes, KEYS[0])
    for position in (0, 1, 2, 3, 2049, 4095):  # every byte of a word counts
        changed = flat.clone()
        changed[position] ^= 0x80
        assert naive.keyed_spans_checksum(changed, offsets, addresses, nbytes, KEYS[0]) != base
    moved = addresses.clone()
    moved[int(nbytes.argmax())] += 4  # the same bytes, landed one word further
    assert naive.keyed_spans_checksum(flat, offsets, moved, nbytes, KEYS[0]) != base
    assert naive.keyed_spans_checksum(flat, offsets, addresses, nbytes, KEYS[1]) != base
