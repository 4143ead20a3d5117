"""Varlen KDA over state slots: the reference against a per-sequence recurrent loop (ragged, fresh and
carried states, strided pools), chunked continuation equal to one-shot, the fresh-slot zeroing kernel,
and the public entry falling back to the reference on CPU. The fla path is in tests/gpu."""

from __future__ import annotations

import pytest
import torch

from kernels.kda import naive
from kernels.kda import varlen as fast
from tests.kernels.device.kda_cases import packed_inputs, per_sequence_loop, strided_pool
from tests.kernels.kernel_testing import assert_rel

HEADS, DIM = 2, 8
CASES = {  # name: (lengths, has_state)
    "decode": ([1, 1, 1], [True, True, False]),
    "decode_all_stateful": ([1, 1], [True, True]),
    "prefill_ragged": ([5, 1, 9, 2], [False, True, True, False]),
    "long_chunks": ([70, 3], [True, False]),
    "empty_seq": ([4, 0], [True, False]),
}


@pytest.mark.parametrize("entry", ["reference", "public"])
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_kda_varlen_matches_per_sequence_loop(case, entry):
    lengths, has_state = CASES[case]
    tensors, (slots, states, cu) = packed_inputs(lengths, has_state, HEADS, DIM, torch.float32, "cpu")
    q, k, v, g, beta = tensors
    pool = strided_pool(8, HEADS, DIM, "cpu", seed=1)
    before = pool.clone()
    want, finals = per_sequence_loop(q, k, v, g, beta, DIM**-0.5, pool, slots, states, cu)
    run = naive.kda_varlen if entry == "reference" else fast.kda_varlen
    o = run(q, k, v, g, beta, DIM**-0.5, pool, slots, states, cu, max(lengths), not all(has_state))
    assert_rel(o, want, 1e-4, "o")
    for slot, final in finals.items():
        assert_rel(pool[slot], final, 1e-4, f"state of slot {slot}")
    others = [s for s in range(8) if s not in finals]
    assert torch.equal(pool[others], before[others]), "a slot outside the batch changed"


@pytest.mark.parametrize("split", [1, 17, 64], ids=["split1", "split17", "split64"])
def test_kda_chunked_prefill_from_a_slot_equals_one_shot(split):
    length = 90
    (q, k, v, g, beta), _ = packed_inputs([length], [False], HEADS, DIM, torch.float32, "cpu", seed=2)
    scale = DIM**-0.5
    slot = torch.tensor([4], dtype=torch.int32)

    def run(pool, rows, has_state):
        n = rows.stop - rows.start
        cu = torch.tensor([0, n], dtype=torch.int32)
        flag = torch.tensor([has_state])
        args = (q[rows], k[rows], v[rows], g[rows], beta[rows], scale, pool, slot, flag, cu)
        return naive.kda_varlen(*args, n)

    pool_once, pool_chunks = strided_pool(6, HEADS, DIM, "cpu", 3), strided_pool(6, HEADS, DIM, "cpu", 3)
    once = run(pool_once, slice(0, length), False)
    pieces = [run(pool_chunks, slice(0, split), False)]
    for start in range(split, length, 1 if split == 1 else split):
        stop = min(length, start + (1 if split == 1 else split))
        pieces.append(run(pool_chunks, slice(start, stop), True))
    assert_rel(torch.cat(pieces), once, 1e-4, "o")
    assert_rel(pool_chunks[4], pool_once[4], 1e-4, "final state")


def test_any_fresh_false_with_a_fresh_sequence_is_refused():
    (q, k, v, g, beta), (slots, states, cu) = packed_inputs(
        [1, 1], [True, False], HEADS, DIM, torch.float32, "cpu"
    )
    pool = strided_pool(4, HEADS, DIM, "cpu", seed=1)
    with pytest.raises(ValueError, match="any_fresh"):
        naive.kda_varlen(q, k, v, g, beta, DIM**-0.5, pool, slots, states, cu, 1, False)


def test_zero_fresh_slots_only_touches_fresh_slots(device):
    pool = strided_pool(5, HEADS, DIM, device, seed=5)
    before = pool.clone()
    slots = torch.tensor([4, 1, 2], dtype=torch.int32, device=device)
    fast.zero_fresh_slots(pool, slots, torch.tensor([True, False, False], device=device))
    assert torch.all(pool[1] == 0) and torch.all(pool[2] == 0)
    for kept in (0, 3, 4):
        assert torch.equal(pool[kept], before[kept])
