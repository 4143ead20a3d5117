"""Per-token state slots (``kernels/kda/token_slots.py``): the short conv (Triton and reference) and the
KDA reference keep the state after every draft in its column's slot, the own slot the state after the
tail, and a step's outputs do not change.

The oracle is the definition: the state after token ``t`` is what running the sequence's first
``t + 1`` tokens alone leaves."""

from __future__ import annotations

import pytest
import torch

from kernels.conv import naive as conv_naive
from kernels.conv import varlen as conv_fast
from kernels.kda import naive as kda_naive
from kernels.kda.token_slots import own_lengths
from tests.kernels.device.kda_cases import packed_inputs, strided_pool

# Three sequences: a verify chunk (tail 1, drafts 3), a plain chunk, a fresh verify chunk (tail 2,
# drafts 2). Their own slots are 3, 0 and 6; the drafts' slots 9..13.
LENGTHS, HAS_STATE, SLOTS = [4, 2, 4], [True, True, False], [3, 0, 6]
TOKEN_SLOTS = [[3, 9, 10, 11], [0, 0, 0, 0], [6, 6, 12, 13]]
OWN = [1, 2, 2]


def _conv_inputs(device, dtype=torch.float32, width=4, channels=24):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(sum(LENGTHS), channels, generator=g).to(dtype).to(device)
    weight = torch.randn(channels, width, generator=g).to(dtype).to(device)
    storage = torch.randn(16, channels * (width - 1) + 16, generator=g).to(dtype).to(device)
    pool = storage[:, 8 : 8 + channels * (width - 1)].view(16, channels, width - 1)
    cu = torch.tensor([0, 4, 6, 10], dtype=torch.int32, device=device)
    slots = torch.tensor(SLOTS, dtype=torch.int32, device=device)
    states = torch.tensor(HAS_STATE, dtype=torch.bool, device=device)
    token_slots = torch.tensor(TOKEN_SLOTS, dtype=torch.int32, device=device)
    return x, weight, pool, slots, states, cu, token_slots


def _conv_states_by_definition(x, weight, pool):
    """slot -> the tail its column's token leaves (the own slot: after its last own column)."""
    want, bounds = {}, [0, 4, 6, 10]
    for seq, slot in enumerate(SLOTS):
        initial = pool[slot][None].float() if HAS_STATE[seq] else None
        for t in range(LENGTHS[seq]):
            rows = x[None, bounds[seq] : bounds[seq] + t + 1].float()
            _, tail = conv_naive.causal_conv1d(rows, weight.float(), initial)
            target = TOKEN_SLOTS[seq][t]
            if target != slot or t == OWN[seq] - 1:
                want[target] = tail[0]
    return want


@pytest.mark.parametrize("kernel", ["triton", "reference"])
def test_conv_keeps_every_drafts_tail_and_its_outputs(kernel, device):
    x, weight, pool, slots, states, cu, token_slots = _conv_inputs(device)
    plain_pool = pool.clone()
    want = _conv_states_by_definition(x, weight, pool)
    run = conv_fast.causal_conv1d_varlen if kernel == "triton" else conv_naive.causal_conv1d_varlen
    untouched = [s for s in range(16) if s not in want]
    before = pool[untouched].clone()
    y = run(x, weight, pool, slots, states, cu, 4, token_slots)
    y_plain = run(x, weight, plain_pool, slots, states, cu, 4)
    assert torch.equal(y, y_plain), "per-token slots changed the conv's outputs"
    for slot, tail in want.items():  # tails are copies of inputs: exact
        assert torch.equal(pool[slot].float(), tail), f"slot {slot}"
    assert torch.equal(pool[untouched], before), "a slot outside the step changed"
    assert torch.equal(pool[0], plain_pool[0]), "the plain sequence's tail differs"


def test_kda_reference_keeps_every_drafts_state(device):
    """The own tokens run as a plain step would (its state in the own slot), then every draft one
    recurrent step at a time, its output row and the state it leaves in its column's slot."""
    del device  # the reference runs on the CPU
    heads, dim, scale = 2, 16, 16**-0.5
    inputs, (slots, states, cu) = packed_inputs(
        LENGTHS, HAS_STATE, heads, dim, torch.float32, "cpu", slots=SLOTS
    )
    pool = strided_pool(16, heads, dim, "cpu", seed=1)
    before = pool.clone()
    o = kda_naive.kda_varlen(*inputs, scale, pool, slots, states, cu, 4, True, torch.tensor(TOKEN_SLOTS))
    bounds = [0, 4, 6, 10]
    for seq, slot in enumerate(SLOTS):
        tail = [x[bounds[seq] : bounds[seq] + OWN[seq]] for x in inputs]
        alone = before.clone()
        cu_tail = torch.tensor([0, OWN[seq]], dtype=torch.int32)
        o_tail = kda_naive.kda_varlen(
            *tail, scale, alone, slots[seq : seq + 1], states[seq : seq + 1], cu_tail, 4
        )
        assert torch.equal(o[bounds[seq] : bounds[seq] + OWN[seq]], o_tail), f"sequence {seq}: tail rows"
        assert torch.equal(pool[slot], alone[slot]), f"sequence {seq}: own slot"
        state = alone[slot][None]
        for t in range(OWN[seq], LENGTHS[seq]):
            row = [x[None, bounds[seq] + t : bounds[seq] + t + 1] for x in inputs]
            out, state = kda_naive.kda_recurrent(*row, scale, state)
            assert torch.equal(o[bounds[seq] + t], out[0, 0]), f"sequence {seq}: draft row {t}"
            assert torch.equal(pool[TOKEN_SLOTS[seq][t]], state[0]), f"sequence {seq}: state after token {t}"


@pytest.mark.parametrize(
    ("rows", "error"),
    [
        ([[9, 3, 3, 3], [0, 0, 0, 0], [6, 6, 6, 6]], r"token_slots\[0\]\[0\]: 9"),
        ([[3, 9, 3, 3], [0, 0, 0, 0], [6, 6, 6, 6]], r"token_slots\[0\]: the own slot 3 after"),
        ([[3, 9], [0, 0], [6, 6]], r"token_slots\[0\]: 2 columns for 4 tokens"),
    ],
)
def test_own_lengths_checks_the_contract(rows, error):
    cu = torch.tensor([0, 4, 6, 10], dtype=torch.int32)
    with pytest.raises(ValueError, match=error):
        own_lengths(torch.tensor(rows), torch.tensor(SLOTS), cu)
    assert own_lengths(torch.tensor(TOKEN_SLOTS), torch.tensor(SLOTS), cu) == OWN
