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
