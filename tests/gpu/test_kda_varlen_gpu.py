"""fla-core's KDA kernels through Baton's state slots, against the float32 per-sequence oracle (CUDA only).

Steps of short sequences (decode, speculative verify chunks: max_query_len up to
RECURRENT_MAX_QUERY_LEN) run fla's fused recurrent kernel in place on the slots, the bits of decoding
token by token; longer prefill and mixed batches run fla's chunk_kda with a gather/scatter of the
batch's states. Also: chunked prefill
continuing from a slot equals one-shot prefill, and the varlen conv on a real StateSlotPool view.
"""

from __future__ import annotations

import pytest
import torch

from kernels.kda import varlen as fast
from tests.kernels.device.kda_cases import packed_inputs, per_sequence_loop, strided_pool
from tests.kernels.kernel_testing import assert_rel

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# fla's chunk kernels take TF32 dots for float32 inputs by default; ``kda_varlen`` compiles them with
# IEEE float32 dots for a float32 model, so the float32 bound holds (the measured error is in the
# failure message).
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
CASES = {  # name: (lengths, has_state, heads, dim)
    "decode_b5": ([1] * 5, [True, True, False, True, True], 4, 64),
    "decode_b4_all_stateful": ([1] * 4, [True] * 4, 4, 64),  # any_fresh False: no zeroing launch
    "decode_b3_d128": ([1, 1, 1], [True, False, True], 2, 128),
    "verify_ragged": ([4, 8, 1, fast.RECURRENT_MAX_QUERY_LEN], [True, True, True, False], 4, 64),
    "prefill_ragged": ([37, 1, 130, 5], [False, True, True, False], 4, 64),
    "prefill_long": ([300, 64], [True, False], 2, 128),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_fla_kda_varlen_matches_oracle(case, dtype):
    lengths, has_state, heads, dim = CASES[case]
    (q, k, v, g, beta), (slots, states, cu) = packed_inputs(lengths, has_state, heads, dim, dtype, "cuda")
    pool = strided_pool(8, heads, dim, "cuda", seed=1)
    before = pool.clone()
    want, finals = per_sequence_loop(q, k, v, g, beta, dim**-0.5, pool, slots, states, cu)
    args = (q, k, v, g, beta, dim**-0.5, pool, slots, states, cu, max(lengths))
    o = fast.kda_varlen(*args, not all(has_state))
    assert o.dtype == dtype
    assert_rel(o.float().cpu(), want, TOL[dtype], "o")
    for slot, final in finals.items():
        assert_rel(pool[slot].cpu(), final, TOL[dtype], f"state of slot {slot}")
    others = [s for s in range(8) if s not in finals]
    assert torch.equal(pool[others], before[others]), "a slot outside the batch changed"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_short_chunk_has_the_bits_of_decoding_it_token_by_token(dtype):
    """Why speculative verify chunks take the recurrent kernel: their KDA rows and states equal the
    plain decode steps' exactly."""
    heads, dim, lengths = 4, 64, [8, 3, 5]
    (q, k, v, g, beta), (slots, states, cu) = packed_inputs(lengths, [True] * 3, heads, dim, dtype, "cuda")
    chunk_pool = strided_pool(8, heads, dim, "cuda", seed=2)
    step_pool = chunk_pool.clone()
    chunk = fast.kda_varlen(q, k, v, g, beta, dim**-0.5, chunk_pool, slots, states, cu, max(lengths), False)
    starts = cu[:-1].tolist()
    for t in range(max(lengths)):
        active = [s for s, n in enumerate(lengths) if t < n]
        rows = torch.tensor([starts[s] + t for s in active], device="cuda")
        one = torch.arange(len(active) + 1, dtype=torch.int32, device="cuda")
        out = fast.kda_varlen(
            q[rows],
            k[rows],
            v[rows],
            g[rows],
            beta[rows],
            dim**-0.5,
            step_pool,
            slots[active],
            states[active],
            one,
            1,
            False,
        )
        assert torch.equal(out, chunk[rows]), f"token {t}"
    assert torch.equal(step_pool[slots.long()], chunk_pool[slots.long()])


@pytest.mark.parametrize("length", [1, 40], ids=["decode", "prefill"])
def test_fla_kda_varlen_takes_strided_rows(length):
    """The KDA layer hands over v (and q, k before normalising) as slices of the conv output."""
    heads, dim = 4, 64
    lengths, has_state = [length, length], [True, True]
    (q, k, v, g, beta), (slots, states, cu) = packed_inputs(
        lengths, has_state, heads, dim, torch.float32, "cuda"
    )
    wide = torch.cat([q, k, v], dim=-1)  # [N, H, 3K]: each part a strided view, as in the layer
    q_s, k_s, v_s = wide.split(dim, dim=-1)
    assert not v_s.is_contiguous()
    pool = strided_pool(4, heads, dim, "cuda", seed=1)
    want, finals = per_sequence_loop(q, k, v, g, beta, dim**-0.5, pool, slots, states, cu)
    o = fast.kda_varlen(q_s, k_s, v_s, g, beta, dim**-0.5, pool, slots, states, cu, length, False)
    assert_rel(o.cpu(), want, TOL[torch.float32], "o")
    for slot, final in finals.items():
        assert_rel(pool[slot].cpu(), final, TOL[torch.float32], f"state of slot {slot}")


@pytest.mark.parametrize("split", [1, 64, 100], ids=["decode_after_prefill", "split64", "split100"])
def test_fla_chunked_prefill_from_a_slot_equals_one_shot(split):
    length, heads, dim = 300, 4, 64
    (q, k, v, g, beta), _ = packed_inputs([length], [False], heads, dim, torch.float32, "cuda", seed=2)
    slot = torch.tensor([4], dtype=torch.int32, device="cuda")

    def run(pool, start, stop, has_state):
        cu = torch.tensor([0, stop - start], dtype=torch.int32, device="cuda")
        flag = torch.tensor([has_state], device="cuda")
        rows = slice(start, stop)
        args = (q[rows], k[rows], v[rows], g[rows], beta[rows], dim**-0.5, pool, slot, flag, cu)
        return fast.kda_varlen(*args, stop - start)

    pool_once, pool_chunks = strided_pool(6, heads, dim, "cuda", 3), strided_pool(6, heads, dim, "cuda", 3)
    once = run(pool_once, 0, length, False)
    first = 200 if split == 1 else split
    pieces = [run(pool_chunks, 0, first, False)]
    step = 1 if split == 1 else split
    for start in range(first, length, step):
        pieces.append(run(pool_chunks, start, min(length, start + step), True))
    assert_rel(torch.cat(pieces), once, 1e-3, "o")
    assert_rel(pool_chunks[4], pool_once[4], 1e-3, "final state")


def test_kda_and_conv_on_a_state_slot_pool_view():
    from kernels.conv import naive as conv_naive
    from kernels.conv import varlen as conv_fast
    from services.engine.cache.layout import CONV, RECURRENT, slot_layout
    from services.engine.cache.state_pool import StateSlotPool
    from services.engine.checkpoint.presets import preset_config
    from services.engine.model.config_loader import load_model_config

    config = load_model_config(preset_config("kimi_linear", "tiny"))
    pool = StateSlotPool(slot_layout(config, torch.bfloat16), 6, "cuda")
    layer = config.layer_types.index("kda")
    recurrent, conv = pool.view(layer, RECURRENT), pool.view(layer, CONV)
    heads, dim = recurrent.shape[1], recurrent.shape[2]
    lengths = [1, 1, 1]
    (q, k, v, g, beta), (slots, states, cu) = packed_inputs(
        lengths, [True, True, False], heads, dim, torch.bfloat16, "cuda", slots=[5, 0, 2]
    )
    recurrent.copy_(torch.randn(recurrent.shape, device="cuda") * 0.1)
    conv.copy_(torch.randn(conv.shape, device="cuda").to(conv.dtype))
    want, finals = per_sequence_loop(q, k, v, g, beta, dim**-0.5, recurrent, slots, states, cu)
    o = fast.kda_varlen(q, k, v, g, beta, dim**-0.5, recurrent, slots, states, cu, 1)
    assert_rel(o.float().cpu(), want, 2e-2, "o")
    for slot, final in finals.items():
        assert_rel(recurrent[slot].cpu(), final, 2e-2, f"state of slot {slot}")

    x = torch.randn(3, conv.shape[1], device="cuda").to(torch.bfloat16)
    weight = torch.randn(conv.shape[1], conv.shape[2] + 1, device="cuda").to(torch.bfloat16)
    conv_ref = conv.float().clone()
    y = conv_fast.causal_conv1d_varlen(x, weight, conv, slots, states, cu, 1)
    y_ref = conv_naive.causal_conv1d_varlen(x.float(), weight.float(), conv_ref, slots, states, cu, 1)
    assert_rel(y.float(), y_ref, 2e-2, "conv y")
    assert_rel(conv[slots.long()].float(), conv_ref[slots.long()], 2e-2, "conv tails")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_per_token_slots_keep_the_bits_of_decoding_each_draft(dtype):
    """``--kda-rollback states``: a verify chunk with per-token slots leaves in each draft's slot the
    state that decoding the chunk token by token has after that draft, bit for bit, and in the own slot
    the state after the tail; the outputs equal the chunk's without per-token slots."""
    heads, dim, lengths = 4, 64, [4, 2, 8]
    token_rows = [[3, 9, 10, 11] + [3] * 4, [0] * 8, [6, 6, 12, 13, 14, 15, 16, 17]]
    own = [1, 2, 2]
    inputs, (slots, states, cu) = packed_inputs(
        lengths, [True] * 3, heads, dim, dtype, "cuda", slots=[3, 0, 6]
    )
    pool = strided_pool(20, heads, dim, "cuda", seed=3)
    plain_pool = pool.clone()
    token_slots = torch.tensor(token_rows, dtype=torch.int32, device="cuda")
    o = fast.kda_varlen(*inputs, dim**-0.5, pool, slots, states, cu, max(lengths), False, token_slots)
    plain = fast.kda_varlen(*inputs, dim**-0.5, plain_pool, slots, states, cu, max(lengths), False)
    assert torch.equal(o, plain), "per-token slots changed the outputs"
    decoded = strided_pool(20, heads, dim, "cuda", seed=3)
    starts = cu[:-1].tolist()
    one = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
    for seq, slot in enumerate([3, 0, 6]):
        for t in range(lengths[seq]):
            row = slice(starts[seq] + t, starts[seq] + t + 1)
            fast.kda_varlen(
                *(x[row] for x in inputs), dim**-0.5, decoded, slots[seq : seq + 1], states[:1], one, 1, False
            )
            if t == own[seq] - 1:
                assert torch.equal(pool[slot], decoded[slot]), f"sequence {seq}: own slot after the tail"
            if t >= own[seq]:
                assert torch.equal(pool[token_rows[seq][t]], decoded[slot]), (
                    f"sequence {seq}: after token {t}"
                )
