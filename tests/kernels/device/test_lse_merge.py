"""The DCP merge of partial attention by LSE: the one-launch Triton kernel (on CUDA, else under the
interpreter) against the reference loop (``kernels.mla.lse_merge``): parts that attended nothing (their
output NaN), rows nobody attended, head widths that are not a multiple of the kernel's column block,
float32 and bfloat16; and a group's merge is the same bits however often it runs."""

import pytest
import torch

from kernels.mla import lse_merge, lse_merge_triton
from tests.kernels.kernel_testing import assert_rel


def partials(parts: int, tokens: int, heads: int, dim: int, dtype: torch.dtype, device: str, seed: int):
    """``parts`` partial results; about a third of the (part, row) pairs attended nothing (``-inf`` LSE,
    NaN output), and row 0 of head 0 was attended by no part."""
    gen = torch.Generator().manual_seed(seed)
    outs = torch.randn(parts, tokens, heads, dim, generator=gen).to(dtype)
    lses = torch.randn(parts, tokens, heads, generator=gen) * 4
    empty = torch.rand(parts, tokens, heads, generator=gen) < 0.33
    empty[:, 0, 0] = True
    lses = lses.masked_fill(empty, float("-inf"))
    outs = outs.masked_fill(empty[..., None], float("nan"))
    return outs.to(device), lses.to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("parts", "dim"), [(1, 64), (2, 200), (8, 160)])
def test_the_kernel_merges_as_the_reference(device, dtype, parts, dim):
    outs, lses = partials(parts, 3, 2, dim, dtype, device, seed=parts * 1000 + dim)
    want_out, want_lse = lse_merge.merge_by_lse(outs, lses)
    out, lse = lse_merge_triton.merge_by_lse(outs, lses)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert torch.equal(out[0, 0], torch.zeros_like(out[0, 0])) and torch.isneginf(lse[0, 0])
    attended = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), attended)
    assert_rel(lse[attended], want_lse[attended], 1e-6, "lse")
    assert_rel(out.float(), want_out.float(), 1e-6 if dtype == torch.float32 else 8e-3, "out")


def test_every_run_gives_the_same_bits(device):
    outs, lses = partials(8, 2, 4, 256, torch.bfloat16, device, seed=7)
    first = lse_merge_triton.merge_by_lse(outs, lses)
    again = lse_merge_triton.merge_by_lse(outs.clone(), lses.clone())
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


def test_shapes_that_disagree_are_refused(device):
    outs, lses = partials(2, 3, 4, 16, torch.float32, device, seed=0)
    with pytest.raises(ValueError, match=r"outs \[R, T, H, D\] and lses \[R, T, H\] must agree"):
        lse_merge_triton.merge_by_lse(outs, lses[:, :2])
