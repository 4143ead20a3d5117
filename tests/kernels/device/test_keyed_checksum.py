"""The keyed row checksum: the Triton kernel (CUDA, or the CPU under the interpreter) gives the
reference's value exactly (integer arithmetic), for rows in any order, several blocks per row, a ragged
last block, keys of both signs; the reference sees a bit flip, swapped words and the top bits of two
words, and its slices equal one pass."""

import pytest
import torch

from kernels.checksum import keyed_triton, naive

KEYS = [0x0123456789ABCDEF, 0xF123456789ABCDEF, 7]


def _storage(rows: int, row_bytes: int, device: str, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (rows, row_bytes), dtype=torch.uint8, generator=g).to(device)


@pytest.mark.parametrize("row_bytes", [64, 4100 * 4], ids=["one-block", "ragged-blocks"])
@pytest.mark.parametrize("key", KEYS, ids=["key", "high-bit-key", "small-key"])
def test_triton_equals_the_reference(row_bytes, key, device):
    storage = _storage(9, row_bytes, device)
    rows = torch.tensor([5, 0, 8, 3], dtype=torch.int64, device=device)
    want = naive.keyed_rows_checksum(storage.cpu(), rows.cpu(), 17, key)
    assert keyed_triton.keyed_rows_checksum(storage, rows, 17, key) == want
    assert keyed_triton.keyed_rows_checksum(storage, rows[:0], 17, key) == 0


def test_the_reference_sees_every_kind_of_change(monkeypatch):
    storage = _storage(4, 256, "cpu", seed=1)
    rows = torch.arange(4)
    base = naive.keyed_rows_checksum(storage, rows, 0, KEYS[0])
    assert 0 <= base < 1 << 64
    flipped = storage.clone()
    flipped[2, 100] ^= 1
    words = storage.clone().view(torch.int32)
    words[1, [3, 4]] = words[1, [4, 3]]
    top = storage.clone().view(torch.int32)
    top[0, [10, 20]] ^= torch.tensor(-(1 << 31), dtype=torch.int32)  # bit 31 of two words
    for changed in (flipped, words.view(torch.uint8), top.view(torch.uint8)):
        assert naive.keyed_rows_checksum(changed, rows, 0, KEYS[0]) != base
    assert naive.keyed_rows_checksum(storage, rows, 0, KEYS[1]) != base
    assert naive.keyed_rows_checksum(storage, rows.flip(0), 0, KEYS[0]) != base  # row order counts
    first = naive.keyed_rows_checksum(storage, rows[:1], 0, KEYS[0])
    rest = naive.keyed_rows_checksum(storage, rows[1:], 64, KEYS[0])  # 64 words a row
    assert (first + rest) % (1 << 64) == base
    monkeypatch.setattr(naive, "SLICE_WORDS", 100)
    assert naive.keyed_rows_checksum(storage, rows, 0, KEYS[0]) == base
    with pytest.raises(ValueError, match="32-bit words"):
        naive.keyed_rows_checksum(storage[:, :10], rows, 0, KEYS[0])
