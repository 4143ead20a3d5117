"""Device sampling against the reference: Philox words bitwise, a row alone equals the row inside other
batches (bitwise), greedy is the first argmax, every sampled token is in the reference's allowed set,
the empirical distribution matches the filtered probabilities (chi-square, fixed seed), logprobs."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernels.sampling import naive
from kernels.sampling import sample as fast
from tests.kernels.kernel_testing import assert_rel

VOCAB = 50


@triton.jit
def _philox_probe(seeds, c0, c1, c2, out, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    seed = tl.load(seeds)
    a = tl.load(c0 + o).to(tl.uint32)
    b = tl.load(c1 + o).to(tl.uint32)
    c = tl.load(c2 + o).to(tl.uint32)
    word, _, _, _ = tl.philox(seed, a, b, c, a * 0)
    tl.store(out + o, word.to(tl.int64))


def test_philox_reference_is_bitwise_tritons(device):
    g = torch.Generator().manual_seed(0)
    c0, c1, c2 = (torch.randint(0, 2**32, (64,), generator=g) for _ in range(3))
    for seed in (0, 12345, -(2**63) + 7, 2**62 + 3):
        out = torch.empty(64, dtype=torch.int64, device=device)
        seed_t = torch.tensor([seed], dtype=torch.int64)
        _philox_probe[(1,)](seed_t.to(device), c0.to(device), c1.to(device), c2.to(device), out, BLOCK=64)
        assert out.cpu().tolist() == naive.philox_word(seed_t, c0, c1, c2).tolist()


def _params(batch, seed=0):
    g = torch.Generator().manual_seed(seed)
    temperature = torch.rand(batch, generator=g) * 1.5 + 0.3
    temperature[::5] = 0.0
    top_k = torch.randint(0, 12, (batch,), generator=g).to(torch.int32)
    top_p = torch.where(torch.rand(batch, generator=g) < 0.5, torch.rand(batch, generator=g) * 0.8 + 0.1, 1.0)
    min_p = torch.where(torch.rand(batch, generator=g) < 0.3, torch.rand(batch, generator=g) * 0.2, 0.0)
    seeds = torch.randint(-(2**62), 2**62, (batch,), generator=g)
    positions = torch.randint(0, 2**40, (batch,), generator=g)
    return temperature, top_k, top_p.float(), min_p.float(), seeds, positions


def _to(device, *tensors):
    return [t.to(device) for t in tensors]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().view(torch.int32) if t.is_floating_point() else t.cpu()


def test_a_row_alone_equals_the_row_in_any_batch_bitwise(device):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(9, VOCAB, generator=g) * 3
    params = _params(9, seed=2)
    full = fast.sample_batch(*_to(device, logits, *params), 3)
    for row in (0, 4, 8):
        for others in ([row], [row, 2, 5], [7, row, 1, 3, 6]):
            pick = torch.tensor(others)
            got = fast.sample_batch(*_to(device, logits[pick], *(p[pick] for p in params)), 3)
            at = others.index(row)
            for name, a, b in zip(("token", "logprob", "top_ids", "top_logprobs"), got, full, strict=True):
                assert torch.equal(_bits(a[at]), _bits(b[row])), name


def test_matches_the_reference_tokens_and_logprobs(device):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(12, VOCAB, generator=g) * 2
    logits[3, 7] = logits[3, 11] = logits[3].max() + 1  # a tie: greedy and top ids take the lower id
    params = _params(12, seed=4)
    got = fast.sample_batch(*_to(device, logits, *params), 4)
    want = naive.sample_batch(logits, *params, 4)
    assert got[0].cpu().tolist() == want[0].tolist()
    assert_rel(got[1].cpu(), want[1], 1e-5, "logprobs")
    assert got[2].cpu().tolist() == want[2].tolist()
    assert_rel(got[3].cpu(), want[3], 1e-5, "top_logprobs")


def test_greedy_is_the_first_argmax(device):
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(5))
    logits[1, 3] = logits[1, 30] = 100.0
    batch = 4
    zeros = torch.zeros(batch)
    args = (
        zeros,
        torch.zeros(batch, dtype=torch.int32),
        torch.ones(batch),
        zeros,
        torch.arange(batch),
        torch.arange(batch),
    )
    tokens = fast.sample_batch(*_to(device, logits, *args), 0)[0]
    assert tokens.cpu().tolist() == logits.argmax(dim=-1).tolist()
    assert tokens[1].item() == 3


FILTERS = {  # name: (temperature, top_k, top_p, min_p)
    "temperature": (0.8, 0, 1.0, 0.0),
    "top_k5": (1.0, 5, 1.0, 0.0),
    "top_p0.7": (1.2, 0, 0.7, 0.0),
    "min_p0.1": (1.0, 0, 1.0, 0.1),
    "all": (0.7, 8, 0.9, 0.05),
}


@pytest.mark.parametrize("name", FILTERS, ids=list(FILTERS))
def test_samples_follow_the_filtered_distribution(name, device):
    # The interpreter runs a program in ~70 ms, so on CPU the draws are the reference's exponential
    # race computed for all rows at once (its per-row loop takes ~4 ms a row), checked equal to the
    # reference's tokens and the kernel's for the first 48 of each filter (240 over the five); on CUDA
    # the kernel draws them all.
    draws = 3000
    temperature, top_k, top_p, min_p = FILTERS[name]
    row = torch.randn(16, generator=torch.Generator().manual_seed(6)) * 1.5
    probs, keep = naive.allowed_tokens(row, temperature, top_k, top_p, min_p)
    want = torch.where(keep, probs, 0.0)
    want = want / want.sum()
    seed, positions = 1234, torch.arange(draws, dtype=torch.int64)
    args = (
        row.expand(draws, -1).contiguous(),
        torch.full((draws,), temperature),
        torch.full((draws,), top_k, dtype=torch.int32),
        torch.full((draws,), top_p),
        torch.full((draws,), min_p),
        torch.full((draws,), seed, dtype=torch.int64),
        positions,
    )
    if device == "cuda":
        tokens = fast.sample_batch(*_to(device, *args), 0)[0].cpu()
    else:
        ids, rows = torch.arange(16, dtype=torch.int64), positions[:, None]
        words = naive.philox_word(torch.tensor(seed), ids, rows & naive.MASK32, (rows >> 32) & naive.MASK32)
        tokens = torch.argmax(torch.where(keep, probs / naive.exponential_from_word(words), -1.0), dim=-1)
        few = 48
        assert naive.sample_batch(*(a[:few] for a in args), 0)[0].tolist() == tokens[:few].tolist()
        checked = fast.sample_batch(*(a[:few] for a in args), 0)[0]
        assert checked.tolist() == tokens[:few].tolist()
    assert keep[tokens].all(), "a token outside the reference's allowed set"
    counts = torch.bincount(tokens, minlength=16).double()
    expected = want.double() * draws
    seen = expected > 0
    chi2 = (((counts - expected) ** 2)[seen] / expected[seen]).sum().item()
    dof = int(seen.sum()) - 1
    # p < 1e-4 bound: mean dof, sd sqrt(2 dof); 4 + 5 sd is far above any fair draw at a fixed seed
    assert chi2 <= dof + 5 * (2 * max(dof, 1)) ** 0.5 + 4, f"chi2 {chi2:.1f} with {dof} dof"


def test_host_seeds_are_signed_64_bit_and_fresh_when_unseeded():
    keys = naive.host_seeds([7, 2**64 - 1, None, None])
    assert keys[:2] == [7, -1]
    assert all(-(2**63) <= k < 2**63 for k in keys) and keys[2] != keys[3]
