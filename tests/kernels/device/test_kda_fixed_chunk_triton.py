"""CF-BI KDA in Triton (``kernels.invariant.kda_triton``): close to the float32 fixed-chunk rows, and
bitwise the same outputs and slot state however a sequence's tokens are split into calls and whatever
other sequences share the launch. On CUDA when there is one, else under the Triton interpreter (tiny
shapes: the interpreter pays per token and head).

Tolerance against ``kernels.kda.fixed_chunk`` (and through it ``kda_recurrent``): relative 1e-5 on the
outputs and the state (the two differ only in ``exp`` and summation order).
"""

from __future__ import annotations

import pytest
import torch

from kernels.invariant.kda_triton import (
    kda_fixed_chunk_triton,
    kda_fixed_chunk_varlen_reference,
    kda_fixed_chunk_varlen_triton,
)
from kernels.kda.fixed_chunk import CHUNK, FixedChunkState, kda_fixed_chunk
from kernels.kda.naive import kda_recurrent
from tests.kernels.kernel_testing import assert_rel
from tests.kernels.test_kda_fixed_chunk import make_inputs

TOL = 1e-5
SCALE = 0.25
# (H, K, V): K = 20 leaves masked key lanes; V = 40 runs two value blocks of 32, the second masked.
SHAPES = {"h2_k16_v8": (2, 16, 8), "h1_k20_v40": (1, 20, 40)}
STATE_FIELDS = ("s0", "open_k", "open_g", "open_delta")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def _assert_bitwise(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, what
    same = _bits(actual) == _bits(expected)
    assert same.numel() > 0, f"{what}: VACUOUS, nothing compared"
    assert bool(same.all()), f"{what}: {int((~same).sum())} of {same.numel()} elements differ in bits"


def _assert_states_bitwise(actual: FixedChunkState, expected: FixedChunkState, what: str) -> None:
    assert actual.count == expected.count, f"{what}: count {actual.count} != {expected.count}"
    for field in STATE_FIELDS:
        _assert_bitwise(getattr(actual, field), getattr(expected, field), f"{what}: {field}")


def _inputs(seq_len, shape, device, seed=0):
    return [t.to(device) for t in make_inputs(seq_len, *shape, seed=seed)]


# (tokens already in the state, tokens now): fresh, and continuing mid-chunk over a boundary.
CASES = {"fresh_T1": (0, 1), "after5_T14": (5, 14)}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_matches_the_float32_fixed_chunk_rows(shape, case, device):
    past, now = case
    q, k, v, g, beta = _inputs(past + now, shape, device)
    # the past tokens go through the torch rows: the kernel reads their open rows from the state
    start = FixedChunkState.zeros(*shape, device)
    _, start = kda_fixed_chunk(q[:past], k[:past], v[:past], g[:past], beta[:past], SCALE, start)
    args = (q[past:], k[past:], v[past:], g[past:], beta[past:], SCALE)
    got, got_state = kda_fixed_chunk_triton(*args, start)
    want, want_state = kda_fixed_chunk(*args, start)
    assert_rel(got, want, TOL, "output")
    assert got_state.count == want_state.count == (past + now) % CHUNK
    for field in STATE_FIELDS:
        assert_rel(getattr(got_state, field), getattr(want_state, field), TOL, field)
    _, plain = kda_recurrent(q[None], k[None], v[None], g[None], beta[None], SCALE, None)
    assert_rel(got_state.recurrent(), plain[0], TOL, "state against the token recurrence")


SPLIT_TOKENS = 20
SPLITS = {
    "token-by-token": [1] * SPLIT_TOKENS,
    "chunk-aligned": [16, 4],
    "ragged-over-the-boundary": [5, 13, 1, 1],
}


@pytest.fixture(scope="module")
def one_call():
    """The split test's inputs and their prefill in one call (computed once: the interpreter is slow)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    inputs = _inputs(SPLIT_TOKENS, SHAPES["h2_k16_v8"], device, seed=1)
    zeros = FixedChunkState.zeros(*SHAPES["h2_k16_v8"], device)
    return inputs, zeros, kda_fixed_chunk_triton(*inputs, SCALE, zeros)


@pytest.mark.parametrize("split", list(SPLITS), ids=list(SPLITS))
def test_bits_do_not_depend_on_how_tokens_are_split(split, one_call):
    """Prefill == chunked prefill == decode, outputs and every state field, bitwise."""
    (q, k, v, g, beta), zeros, (whole, whole_state) = one_call
    state, pieces, start = zeros, [], 0
    for size in SPLITS[split]:
        rows = slice(start, start + size)
        out, state = kda_fixed_chunk_triton(q[rows], k[rows], v[rows], g[rows], beta[rows], SCALE, state)
        pieces.append(out)
        start += size
    assert start == SPLIT_TOKENS
    _assert_bitwise(torch.cat(pieces), whole, "outputs")
    _assert_states_bitwise(state, whole_state, split)


def _slot_pool(slots: int, shape, device):
    """Strided slot views like the pool's (each field padded in its slot, last dim contiguous), NaN in
    every slot so a state that was not written, or read when it should not be, shows."""
    heads, k_dim, v_dim = shape

    def field(*dims):
        padded = torch.full((slots, *dims[:-1], dims[-1] + 3), float("nan"), device=device)
        return padded[..., : dims[-1]]

    count = torch.zeros(slots, 2, dtype=torch.int32, device=device)[:, :1]
    return (
        field(heads, k_dim, v_dim),
        field(CHUNK, heads, k_dim),
        field(CHUNK, heads, k_dim),
        field(CHUNK, heads, v_dim),
        count,
    )


# Four sequences: (tokens this step, tokens already in the slot), and the slot each one uses.
SEQUENCES = [(3, 0), (1, 21), (6, 14), (4, 32)]
SLOTS = [5, 2, 7, 0]


def _prepared_pool(shape, device):
    """The slot pool with sequences 1-3's past tokens written by the torch rows (slot 5 stays NaN)."""
    pool = _slot_pool(8, shape, device)
    for index, (_, past) in enumerate(SEQUENCES):
        if past:
            q, k, v, g, beta = _inputs(past, shape, device, seed=10 + index)
            fresh = torch.zeros(1, dtype=torch.bool, device=device)
            cu = torch.tensor([0, past], dtype=torch.int32, device=device)
            slot = torch.tensor([SLOTS[index]], dtype=torch.int32, device=device)
            kda_fixed_chunk_varlen_reference(q, k, v, g, beta, SCALE, cu, slot, fresh, *pool)
    return pool


def _step(members, steps, shape, device):
    """One launch over ``members`` (indices into SEQUENCES): their outputs and slot states."""
    pool = _prepared_pool(shape, device)
    lengths = [SEQUENCES[i][0] for i in members]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    slots = torch.tensor([SLOTS[i] for i in members], dtype=torch.int32, device=device)
    has = torch.tensor([SEQUENCES[i][1] > 0 for i in members], dtype=torch.bool, device=device)
    inputs = [torch.cat([steps[i][j] for i in members]) for j in range(5)]
    out = kda_fixed_chunk_varlen_triton(*inputs, SCALE, cu, slots, has, *pool)
    rows = dict(zip(members, torch.split(out, lengths), strict=True))
    return rows, {i: [field[SLOTS[i]] for field in pool] for i in members}


def test_a_sequence_has_the_same_bits_alone_and_beside_others(device):
    shape = SHAPES["h2_k16_v8"]
    steps = [_inputs(n, shape, device, seed=20 + i) for i, (n, _) in enumerate(SEQUENCES)]
    rows, states = _step([3, 1, 0, 2], steps, shape, device)
    pairs = _step([2, 0], steps, shape, device)
    for i in range(len(SEQUENCES)):
        alone_rows, alone_states = _step([i], steps, shape, device)
        if i in pairs[0]:
            _assert_bitwise(pairs[0][i], alone_rows[i], f"sequence {i} outputs beside one other")
        _assert_bitwise(rows[i], alone_rows[i], f"sequence {i} outputs")
        for name, got, want in zip(STATE_FIELDS, states[i], alone_states[i], strict=False):
            _assert_bitwise(got, want, f"sequence {i}: {name}")
        assert torch.equal(states[i][4], alone_states[i][4]), f"sequence {i}: count"


def test_varlen_matches_its_reference_and_a_fresh_slot_ignores_what_it_held(device):
    shape = SHAPES["h2_k16_v8"]
    steps = [_inputs(n, shape, device, seed=30 + i) for i, (n, _) in enumerate(SEQUENCES)]
    members = [0, 1, 2, 3]
    lengths = [SEQUENCES[i][0] for i in members]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    slots = torch.tensor(SLOTS, dtype=torch.int32, device=device)
    has = torch.tensor([past > 0 for _, past in SEQUENCES], device=device)  # slot 5 holds NaN: unread
    inputs = [torch.cat([steps[i][j] for i in members]) for j in range(5)]
    got_pool = _prepared_pool(shape, device)
    want_pool = [t.clone() for t in got_pool]
    got = kda_fixed_chunk_varlen_triton(*inputs, SCALE, cu, slots, has, *got_pool)
    want = kda_fixed_chunk_varlen_reference(*inputs, SCALE, cu, slots, has, *want_pool)
    assert_rel(got, want, TOL, "output")
    for name, got_field, want_field in zip(STATE_FIELDS, got_pool, want_pool, strict=False):
        assert_rel(got_field[SLOTS], want_field[SLOTS], TOL, name)
    counts = [(now + past) % CHUNK for now, past in SEQUENCES]
    assert got_pool[4][SLOTS, 0].tolist() == want_pool[4][SLOTS, 0].tolist() == counts


def test_bad_state_is_refused_naming_the_field(device):
    shape = SHAPES["h2_k16_v8"]
    q, k, v, g, beta = _inputs(2, shape, device)
    pool = list(_slot_pool(2, shape, device))
    pool[1] = pool[1].to(torch.float64)
    cu = torch.tensor([0, 2], dtype=torch.int32, device=device)
    one = torch.zeros(1, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=r"open_k: expected \[slots, 16, 2, 16\] torch.float32"):
        kda_fixed_chunk_varlen_triton(q, k, v, g, beta, SCALE, cu, one, one.bool(), *pool)
