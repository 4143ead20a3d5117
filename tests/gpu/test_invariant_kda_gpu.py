"""CF-BI KDA in Triton (``kernels.invariant.kda_triton``) compiled for a CUDA GPU (skipped without one),
at the K3 layer shape (32 heads x 128): close to the float32 fixed-chunk rows, and bitwise the same
outputs and slot state across prefill, chunked prefill and decode splits and across batch compositions,
compared as integers.

Tolerance: relative 1e-4 against ``kda_fixed_chunk`` (the GPU's ``exp`` is not correctly rounded).
Run this file in its own pytest process: with ``TRITON_INTERPRET=1`` set (``tests/kernels`` sets it)
the kernel would be interpreted instead of compiled.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from kernels.invariant.kda_triton import kda_fixed_chunk_triton, kda_fixed_chunk_varlen_triton
from kernels.kda.fixed_chunk import CHUNK, FixedChunkState, kda_fixed_chunk
from tests.kernels.kernel_testing import assert_rel

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        os.environ.get("TRITON_INTERPRET") == "1", reason="TRITON_INTERPRET=1: run in its own process"
    ),
]
DEVICE = "cuda"
HEADS, DIM = 32, 128
SCALE = DIM**-0.5
STATE_FIELDS = ("s0", "open_k", "open_g", "open_delta")


def _inputs(tokens: int, seed: int):
    g = torch.Generator(device=DEVICE).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=DEVICE)

    q = F.normalize(randn(tokens, HEADS, DIM), dim=-1)
    k = F.normalize(randn(tokens, HEADS, DIM), dim=-1)
    gate = -torch.rand(tokens, HEADS, DIM, generator=g, device=DEVICE) * 0.2
    beta = torch.rand(tokens, HEADS, generator=g, device=DEVICE)
    return q, k, randn(tokens, HEADS, DIM), gate, beta


def _assert_bitwise(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    same = actual.contiguous().view(torch.int32) == expected.contiguous().view(torch.int32)
    assert same.numel() > 0, f"{what}: VACUOUS, nothing compared"
    assert bool(same.all()), f"{what}: {int((~same).sum())} of {same.numel()} elements differ in bits"


def test_matches_the_float32_fixed_chunk_rows():
    q, k, v, g, beta = _inputs(40, seed=0)
    zeros = FixedChunkState.zeros(HEADS, DIM, DIM, DEVICE)
    got, got_state = kda_fixed_chunk_triton(q, k, v, g, beta, SCALE, zeros)
    want, want_state = kda_fixed_chunk(q, k, v, g, beta, SCALE, zeros)
    assert_rel(got, want, 1e-4, "output")
    assert got_state.count == want_state.count == 40 % CHUNK
    for field in STATE_FIELDS:
        assert_rel(getattr(got_state, field), getattr(want_state, field), 1e-4, field)


SPLITS = {"token-by-token": [1] * 100, "chunk-aligned": [48, 32, 20], "ragged": [37, 1, 15, 2, 45]}


@pytest.mark.parametrize("split", list(SPLITS), ids=list(SPLITS))
def test_bits_do_not_depend_on_how_tokens_are_split(split):
    q, k, v, g, beta = _inputs(100, seed=1)
    zeros = FixedChunkState.zeros(HEADS, DIM, DIM, DEVICE)
    whole, whole_state = kda_fixed_chunk_triton(q, k, v, g, beta, SCALE, zeros)
    state, pieces, start = zeros, [], 0
    for size in SPLITS[split]:
        rows = slice(start, start + size)
        out, state = kda_fixed_chunk_triton(q[rows], k[rows], v[rows], g[rows], beta[rows], SCALE, state)
        pieces.append(out)
        start += size
    _assert_bitwise(torch.cat(pieces), whole, "outputs")
    assert state.count == whole_state.count
    for field in STATE_FIELDS:
        _assert_bitwise(getattr(state, field), getattr(whole_state, field), field)


LENGTHS = [1, 1, 70, 5, 1, 33, 16, 1]  # a decode-and-prefill step of 8 sequences


def _pool(slots: int):
    """Zeroed slots: ``s0, open_k, open_g, open_delta, open_count``."""
    rows = torch.zeros(slots, CHUNK, HEADS, DIM, device=DEVICE)
    s0 = torch.zeros(slots, HEADS, DIM, DIM, device=DEVICE)
    return [s0, rows, rows.clone(), rows.clone(), torch.zeros(slots, 1, dtype=torch.int32, device=DEVICE)]


def _step(members: list[int], steps, history) -> tuple[dict, dict]:
    """Sequences ``members`` in one launch, each continuing its history: outputs and slot states."""
    pool = _pool(len(LENGTHS))
    for i in members:  # every sequence first runs its own history alone, in slot i
        hq, hk, hv, hg, hb = history[i]
        cu = torch.tensor([0, hq.shape[0]], dtype=torch.int32, device=DEVICE)
        slot = torch.tensor([i], dtype=torch.int32, device=DEVICE)
        fresh = torch.zeros(1, dtype=torch.bool, device=DEVICE)
        kda_fixed_chunk_varlen_triton(hq, hk, hv, hg, hb, SCALE, cu, slot, fresh, *pool)
    lengths = [LENGTHS[i] for i in members]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    slots = torch.tensor(members, dtype=torch.int32, device=DEVICE)
    has = torch.ones(len(members), dtype=torch.bool, device=DEVICE)
    inputs = [torch.cat([steps[i][j] for i in members]) for j in range(5)]
    out = kda_fixed_chunk_varlen_triton(*inputs, SCALE, cu, slots, has, *pool)
    rows = dict(zip(members, torch.split(out, lengths), strict=True))
    return rows, {i: [field[i] for field in pool] for i in members}


def test_a_sequence_has_the_same_bits_alone_and_in_any_batch():
    steps = [_inputs(n, seed=10 + i) for i, n in enumerate(LENGTHS)]
    history = [_inputs(3 + 7 * i, seed=30 + i) for i in range(len(LENGTHS))]  # open rows 3, 10, 1, ...
    batches = [list(range(8)), [7, 2, 5, 0], [3, 6]]
    alone = {i: _step([i], steps, history) for i in range(len(LENGTHS))}
    for members in batches:
        rows, states = _step(members, steps, history)
        for i in members:
            _assert_bitwise(rows[i], alone[i][0][i], f"sequence {i} in {members}: outputs")
            for name, got, want in zip((*STATE_FIELDS, "count"), states[i], alone[i][1][i], strict=True):
                assert torch.equal(got, want), f"sequence {i} in {members}: {name}"
