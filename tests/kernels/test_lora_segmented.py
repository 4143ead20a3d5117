"""The segmented LoRA delta kernel (Triton; interpreted on the CPU) against its float32 reference:
rows of several adapters, rows without one, ranks padded, odd sizes."""

import pytest
import torch

from kernels.lora.naive import lora_delta_reference
from kernels.lora.segmented import lora_delta_segmented
from tests.conftest import TEST_DEVICE, relative_error


@pytest.mark.parametrize(
    "rows, k, m, rank, adapters",
    [(1, 64, 64, 4, 1), (7, 64, 96, 8, 3), (19, 100, 33, 5, 2), (33, 32, 512, 16, 4)],
    ids=["one-row", "three-adapters", "odd-sizes", "wide-out"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_segmented_matches_reference(rows, k, m, rank, adapters, dtype):
    generator = torch.Generator().manual_seed(rows * 7 + k)
    x = torch.randn(rows, k, generator=generator).to(dtype)
    a = torch.randn(adapters, rank, k, generator=generator)
    b = torch.randn(adapters, m, rank, generator=generator)
    a[0, rank - 1 :] = 0  # adapter 0 has a smaller rank, zero-padded
    b[0, :, rank - 1 :] = 0
    slots = torch.randint(-1, adapters, (rows,), generator=generator)
    slots[0] = adapters - 1
    device = TEST_DEVICE
    got = lora_delta_segmented(x.to(device), slots.to(device), a.to(device), b.to(device)).cpu()
    want = lora_delta_reference(x, slots, a, b)
    assert torch.equal(got[slots < 0], torch.zeros_like(got[slots < 0]))
    assert relative_error(got, want) < 1e-5
