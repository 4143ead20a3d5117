"""Varlen short convolution (Triton) against the reference: ragged batches, fresh and carried tails,
chunked continuation equal to one-shot, strided slot pools."""

from __future__ import annotations

import pytest
import torch

from kernels.conv import naive
from kernels.conv import varlen as fast
from tests.kernels.kernel_testing import assert_rel

CASES = {  # name: (lengths, has_state, width)
    "decode_3seqs": ([1, 1, 1], [True, False, True], 4),
    "ragged_prefill": ([5, 1, 9, 2], [False, True, True, False], 4),
    "short_than_tail": ([2, 1], [True, True], 4),
    "empty_seq": ([3, 0, 4], [True, True, False], 4),
    "width2": ([7, 3], [True, False], 2),
    "long_40": ([40, 1], [False, True], 4),
}
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def _pool(num_slots, channels, width, dtype, device, seed):
    """A strided ``[num_slots, C, W-1]`` view inside wider rows, like ``StateSlotPool.view``."""
    g = torch.Generator().manual_seed(seed)
    storage = torch.randn(num_slots, channels * (width - 1) + 16, generator=g).to(dtype).to(device)
    return storage[:, 8 : 8 + channels * (width - 1)].view(num_slots, channels, width - 1)


def _inputs(lengths, has_state, width, dtype, device, channels=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    x = torch.randn(n, channels, generator=g).to(dtype).to(device)
    weight = torch.randn(channels, width, generator=g).to(dtype).to(device)
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=device)
    slots = torch.tensor([5, 0, 3, 6][: len(lengths)], dtype=torch.int32, device=device)
    states = torch.tensor(has_state, dtype=torch.bool, device=device)
    return x, weight, slots, states, cu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_conv_varlen_matches_reference(case, dtype, device):
    lengths, has_state, width = CASES[case]
    x, weight, slots, states, cu = _inputs(lengths, has_state, width, dtype, device)
    pool_fast = _pool(8, x.shape[1], width, dtype, device, seed=1)
    pool_ref = pool_fast.clone()
    untouched = [s for s in range(8) if s not in slots.tolist()]
    before = pool_fast[untouched].clone()

    y = fast.causal_conv1d_varlen(x, weight, pool_fast, slots, states, cu, max(lengths))
    pool_ref32 = pool_ref.float().contiguous()
    want = naive.causal_conv1d_varlen(x.float(), weight.float(), pool_ref32, slots, states, cu, max(lengths))
    assert_rel(y.float(), want, TOL[dtype], "y")
    assert_rel(pool_fast[slots.long()].float(), pool_ref32[slots.long()], TOL[dtype], "tails")
    assert torch.equal(pool_fast[untouched], before), "a slot outside the batch changed"


@pytest.mark.parametrize("split", [1, 3, 6], ids=["split1", "split3", "split6"])
def test_conv_chunked_continuation_equals_one_shot(split, device):
    length = 11
    x, weight, _, _, _ = _inputs([length], [False], 4, torch.float32, device, seed=3)
    pool_once = _pool(2, x.shape[1], 4, torch.float32, device, seed=4)
    pool_chunks = pool_once.clone()
    slot = torch.tensor([1], dtype=torch.int32, device=device)

    def cu(n):
        return torch.tensor([0, n], dtype=torch.int32, device=device)

    once = fast.causal_conv1d_varlen(
        x, weight, pool_once, slot, torch.tensor([False], device=device), cu(length), length
    )
    first = fast.causal_conv1d_varlen(
        x[:split], weight, pool_chunks, slot, torch.tensor([False], device=device), cu(split), split
    )
    rest = fast.causal_conv1d_varlen(
        x[split:], weight, pool_chunks, slot, torch.tensor([True], device=device), cu(length - split), 8
    )
    assert_rel(torch.cat([first, rest]), once, 1e-6, "y")
    assert torch.allclose(pool_chunks[1], pool_once[1], atol=0, rtol=0), "tails differ"
