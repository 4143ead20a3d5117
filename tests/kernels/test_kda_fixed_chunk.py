"""CF-BI fixed-chunk KDA: equals the token recurrence; its bits do not depend on how tokens are grouped."""

import math

import pytest
import torch

from kernels.kda.fixed_chunk import CHUNK, FixedChunkState, kda_fixed_chunk
from kernels.kda.naive import kda_forget_gate, kda_recurrent, l2_normalize
from tests.kernels.kernel_testing import assert_rel

SHAPES = [(2, 16, 8), (3, 8, 12)]  # (H, K, V)


def make_inputs(seq_len, heads, k_dim, v_dim, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    q, k = l2_normalize(randn(seq_len, heads, k_dim)), l2_normalize(randn(seq_len, heads, k_dim))
    a_log = torch.log(torch.rand(heads, generator=generator) * 15 + 1)
    a_log[0] = math.log(16.0)
    g = kda_forget_gate(randn(seq_len, heads, k_dim), 0.5 * randn(heads * k_dim), a_log)
    beta = torch.sigmoid(randn(seq_len, heads))
    return q, k, randn(seq_len, heads, v_dim), g, beta


@pytest.mark.parametrize("seq_len", [1, 15, 16, 17, 40, 64], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("shape", SHAPES, ids=[f"h{h}_k{k}_v{v}" for h, k, v in SHAPES])
def test_matches_the_token_recurrence(shape, seq_len):
    heads, k_dim, v_dim = shape
    q, k, v, g, beta = make_inputs(seq_len, heads, k_dim, v_dim)
    scale = k_dim**-0.5
    want, want_state = kda_recurrent(q[None], k[None], v[None], g[None], beta[None], scale, None)
    got, state = kda_fixed_chunk(q, k, v, g, beta, scale, FixedChunkState.zeros(heads, k_dim, v_dim))
    assert_rel(got, want[0], 1e-5, "output")
    assert_rel(state.recurrent(), want_state[0], 1e-5, "state")
    assert state.count == seq_len % CHUNK


SPLITS = {
    "token-by-token": [1] * 40,
    "chunk-aligned": [16, 16, 8],
    "ragged": [5, 13, 1, 21],
    "one-call": [40],
}


@pytest.mark.parametrize("split", list(SPLITS), ids=list(SPLITS))
def test_bits_do_not_depend_on_how_tokens_are_grouped(split):
    q, k, v, g, beta = make_inputs(40, 2, 16, 8, seed=1)
    whole, whole_state = kda_fixed_chunk(q, k, v, g, beta, 0.25, FixedChunkState.zeros(2, 16, 8))
    state, pieces, start = FixedChunkState.zeros(2, 16, 8), [], 0
    for size in SPLITS[split]:
        rows = slice(start, start + size)
        out, state = kda_fixed_chunk(q[rows], k[rows], v[rows], g[rows], beta[rows], 0.25, state)
        pieces.append(out)
        start += size
    assert torch.equal(torch.cat(pieces), whole)
    assert torch.equal(state.s0, whole_state.s0) and state.count == whole_state.count
    assert torch.equal(state.open_delta, whole_state.open_delta)


def test_input_state_is_not_modified():
    q, k, v, g, beta = make_inputs(20, 2, 16, 8)
    _, state = kda_fixed_chunk(q, k, v, g, beta, 0.25, FixedChunkState.zeros(2, 16, 8))
    before = state.clone()
    kda_fixed_chunk(q, k, v, g, beta, 0.25, state)
    assert torch.equal(state.s0, before.s0) and torch.equal(state.open_k, before.open_k)
    assert state.count == before.count == 4


def test_backward_matches_the_token_recurrence():
    """Autograd runs through the CF-BI rows (the trainer's KDA backward) and agrees with the recurrence's."""
    inputs = [t.requires_grad_(True) for t in make_inputs(40, 2, 16, 8, seed=2)]
    weights = torch.randn(40, 2, 8, generator=torch.Generator().manual_seed(3))
    got, _ = kda_fixed_chunk(*inputs, 0.25, FixedChunkState.zeros(2, 16, 8))
    got_grads = torch.autograd.grad((got * weights).sum(), inputs)
    want, _ = kda_recurrent(*(t[None] for t in inputs), 0.25, None)
    want_grads = torch.autograd.grad((want[0] * weights).sum(), inputs)
    for name, got_grad, want_grad in zip("q k v g beta".split(), got_grads, want_grads, strict=True):
        assert torch.isfinite(got_grad).all(), name
        assert_rel(got_grad, want_grad, 1e-4, f"d{name}")
