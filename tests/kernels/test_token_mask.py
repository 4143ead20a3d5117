"""The token bitmask's batched application against the per-row reference: bitwise, for vocabularies
that do and do not fill their last word, bitmasks narrower than the vocabulary, every bit pattern."""

import pytest
import torch

from kernels.token_mask.batched import mask_batch
from kernels.token_mask.naive import mask_rows


@pytest.mark.parametrize(
    ("batch", "vocab", "words"),
    [(1, 64, 2), (3, 100, 4), (4, 257, 9), (2, 100, 3)],
    ids=["full-words", "partial-last-word", "odd-vocab", "bitmask-narrower"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_batched_equals_reference(batch, vocab, words, dtype):
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(batch, vocab, generator=generator).to(dtype)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (batch, words), generator=generator, dtype=torch.int64)
    bitmask = bitmask.to(torch.int32)
    bitmask[0, 0] = -1  # every bit of a word set (the top bit makes it negative)
    out = mask_batch(logits, bitmask)
    assert out.dtype == torch.float32
    assert torch.equal(out, mask_rows(logits, bitmask))
    kept = torch.isfinite(out)
    assert torch.equal(out[kept], logits.float()[kept])
    if 32 * words < vocab:
        assert torch.isinf(out[:, 32 * words :]).all()


def test_a_single_allowed_token():
    logits = torch.zeros(2, 70)
    bitmask = torch.zeros(2, 3, dtype=torch.int32)
    bitmask[0, 2] = 1 << 5  # token 69
    bitmask[1, 0] = 1  # token 0
    out = mask_batch(logits, bitmask)
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [69]
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == [0]
