"""KDA references: chunked form vs token recurrence, state carry, batch rows, forget gate, transformers."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.kimi_linear import modeling_kimi_linear as hf_kimi

from kernels.kda.chunk import kda_chunked
from kernels.kda.naive import kda_forget_gate, kda_recurrent, l2_normalize
from tests.kernels.kernel_testing import assert_rel, rel_err

TOL = 1e-5

SHAPES = [(2, 16, 32), (3, 32, 16)]  # (H, K, V), K != V
SHAPE_IDS = [f"h{h}_k{k}_v{v}" for h, k, v in SHAPES]


def make_inputs(batch: int, seq_len: int, heads: int, k_dim: int, v_dim: int, with_state: bool):
    """Realistic KDA inputs: L2-normalised q/k, gates from ``kda_forget_gate`` with strong decays."""
    q = l2_normalize(torch.randn(batch, seq_len, heads, k_dim))
    k = l2_normalize(torch.randn(batch, seq_len, heads, k_dim))
    v = torch.randn(batch, seq_len, heads, v_dim)
    a_log = torch.log(torch.empty(heads).uniform_(1.0, 16.0))
    a_log[0] = math.log(16.0)  # at least one head with strong decays
    dt_bias = 0.5 * torch.randn(heads * k_dim)
    g = kda_forget_gate(torch.randn(batch, seq_len, heads, k_dim), dt_bias, a_log)
    beta = torch.sigmoid(torch.randn(batch, seq_len, heads))
    state = torch.randn(batch, heads, k_dim, v_dim) if with_state else None
    return q, k, v, g, beta, state


@pytest.mark.parametrize("with_state", [False, True], ids=["zero_state", "init_state"])
@pytest.mark.parametrize("chunk_size", [16, 64], ids=["c16", "c64"])
@pytest.mark.parametrize("seq_len", [1, 5, 16, 63, 64, 65, 130], ids=lambda t: f"T{t}")
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_chunked_matches_recurrent(shape, seq_len, chunk_size, with_state):
    torch.manual_seed(0)
    heads, k_dim, v_dim = shape
    q, k, v, g, beta, state = make_inputs(2, seq_len, heads, k_dim, v_dim, with_state)
    if seq_len >= 16:
        assert g.min() < -4.0, "inputs should include strong decays"
    state_before = None if state is None else state.clone()
    scale = k_dim**-0.5

    out_ref, final_ref = kda_recurrent(q, k, v, g, beta, scale, state)
    out, final = kda_chunked(q, k, v, g, beta, scale, state, chunk_size=chunk_size)

    assert out.shape == (2, seq_len, heads, v_dim) and final.shape == (2, heads, k_dim, v_dim)
    assert final.dtype == torch.float32
    assert_rel(out, out_ref, TOL, "output")
    assert_rel(final, final_ref, TOL, "final state")
    if state is not None:
        assert torch.equal(state, state_before), "initial state was modified in place"


def _recurrent_token_by_token(q, k, v, g, beta, scale, state):
    outs = []
    for t in range(q.shape[1]):
        o, state = kda_recurrent(*(x[:, t : t + 1] for x in (q, k, v, g, beta)), scale, state)
        outs.append(o)
    return torch.cat(outs, dim=1), state


def _chunked16(q, k, v, g, beta, scale, state):
    return kda_chunked(q, k, v, g, beta, scale, state, chunk_size=16)


SPLIT_MODES = {
    "chunked_then_chunked": (_chunked16, _chunked16),
    "recurrent_then_recurrent": (kda_recurrent, kda_recurrent),
    "chunked_then_recurrent_tokens": (_chunked16, _recurrent_token_by_token),
}


@pytest.mark.parametrize("split", [1, 37, 64, 99], ids=lambda s: f"split{s}")
@pytest.mark.parametrize("mode", list(SPLIT_MODES), ids=list(SPLIT_MODES))
@pytest.mark.parametrize("with_state", [False, True], ids=["zero_state", "init_state"])
def test_split_sequence_carries_state(mode, split, with_state):
    torch.manual_seed(1)
    seq_len, heads, k_dim, v_dim = 100, 2, 16, 24
    q, k, v, g, beta, state = make_inputs(2, seq_len, heads, k_dim, v_dim, with_state)
    scale = k_dim**-0.5
    first_fn, rest_fn = SPLIT_MODES[mode]

    out_whole, final_whole = first_fn(q, k, v, g, beta, scale, state)
    head = [x[:, :split] for x in (q, k, v, g, beta)]
    tail = [x[:, split:] for x in (q, k, v, g, beta)]
    out_a, mid = first_fn(*head, scale, state)
    out_b, final = rest_fn(*tail, scale, mid)

    assert_rel(torch.cat([out_a, out_b], dim=1), out_whole, TOL, "output")
    assert_rel(final, final_whole, TOL, "final state")


@pytest.mark.parametrize("fn", ["recurrent", "chunked"])
def test_batch_rows_are_independent(fn):
    torch.manual_seed(2)
    heads, k_dim, v_dim = 2, 16, 32
    q, k, v, g, beta, state = make_inputs(3, 45, heads, k_dim, v_dim, with_state=True)
    scale = k_dim**-0.5
    run = kda_recurrent if fn == "recurrent" else _chunked16
    out, final = run(q, k, v, g, beta, scale, state)
    for i in range(3):
        row = slice(i, i + 1)
        out_i, final_i = run(q[row], k[row], v[row], g[row], beta[row], scale, state[row])
        assert rel_err(out[row], out_i) <= 1e-6, f"row {i} output"
        assert rel_err(final[row], final_i) <= 1e-6, f"row {i} final state"


@pytest.mark.parametrize("fn", ["recurrent", "chunked"])
def test_right_padded_batch_matches_per_sequence_loop(fn):
    """Variable length in a dense batch: tokens with ``k = 0, beta = 0, g = 0`` leave the state alone."""
    torch.manual_seed(3)
    lengths = [5, 17, 40]
    heads, k_dim, v_dim, padded_len = 2, 16, 24, 41
    run = kda_recurrent if fn == "recurrent" else _chunked16
    scale = k_dim**-0.5
    seqs = [make_inputs(1, n, heads, k_dim, v_dim, with_state=True) for n in lengths]

    def pad_time(x: torch.Tensor) -> torch.Tensor:
        fill = torch.zeros(1, padded_len - x.shape[1], *x.shape[2:])
        return torch.cat([x, fill], dim=1)

    k, v, g, beta = (torch.cat([pad_time(s[i]) for s in seqs]) for i in (1, 2, 3, 4))
    q = torch.cat([pad_time(s[0]) for s in seqs])
    for i, n in enumerate(lengths):
        q[i, n:] = torch.randn(padded_len - n, heads, k_dim)  # queries of padding tokens are arbitrary
    state = torch.cat([s[5] for s in seqs])

    out, final = run(q, k, v, g, beta, scale, state)
    for i, (n, seq) in enumerate(zip(lengths, seqs, strict=True)):
        out_i, final_i = kda_recurrent(*seq[:5], scale, seq[5])
        assert_rel(out[i, :n], out_i[0], TOL, f"sequence {i} output")
        assert_rel(final[i], final_i[0], TOL, f"sequence {i} final state")


def _softplus64(x: torch.Tensor) -> torch.Tensor:
    """Overflow-free softplus in float64: ``max(x, 0) + log1p(exp(-|x|))``."""
    x = x.to(torch.float64)
    return x.clamp_min(0) + torch.log1p(torch.exp(-x.abs()))


def test_forget_gate_formula_and_identity_branch():
    torch.manual_seed(4)
    heads, k_dim = 3, 8
    logits = 3.0 * torch.randn(2, 5, heads, k_dim)
    # values that land above the identity threshold, some where exp() overflows in float32
    logits[0, 0, 0, :4] = torch.tensor([25.0, 60.0, 100.0, 1000.0])
    logits[1, 2, 1, :2] = torch.tensor([-30.0, -80.0])
    dt_bias = torch.randn(heads * k_dim)
    a_log = torch.log(torch.empty(heads).uniform_(1.0, 16.0))

    g = kda_forget_gate(logits, dt_bias, a_log)

    x = logits.double() + dt_bias.double().view(heads, k_dim)
    assert (x > 20).any() and (x <= 20).any() and (x > 89).any(), "both softplus branches must run"
    rate = torch.exp(a_log.double()).view(heads, 1)
    expected = -rate * _softplus64(x)
    assert g.dtype == torch.float32 and torch.isfinite(g).all() and (g <= 0).all()
    # float32 ``log(1 + exp(x))`` (the fla formula) is off by up to half an ulp of 1.0 for negative x
    err = (g.double() - expected).abs()
    assert (err <= 1e-6 * expected.abs() + 2.5e-7 * rate).all(), f"max abs error {err.max().item():.3e}"


def test_forget_gate_matches_transformers_module():
    torch.manual_seed(5)
    heads, k_dim, hidden = 4, 16, 32
    config = hf_kimi.KimiLinearConfig(hidden_size=hidden, linear_num_heads=heads, linear_head_dim=k_dim)
    module = hf_kimi.KimiLinearForgetGate(config)
    with torch.no_grad():
        for p in (module.f_a_proj.weight, module.f_b_proj.weight, module.dt_bias):
            p.copy_(torch.randn_like(p))
        module.A_log.copy_(torch.log(torch.empty(1, 1, heads, 1).uniform_(1.0, 16.0)))
    hidden_states = 2.0 * torch.randn(2, 7, hidden)

    with torch.no_grad():
        expected = module(hidden_states)
        logits = module.f_b_proj(module.f_a_proj(hidden_states)).view(2, 7, heads, k_dim)
        g = kda_forget_gate(logits, module.dt_bias, module.A_log)
    assert (logits.double() + module.dt_bias.double().view(heads, k_dim) > 20).any()
    assert_rel(g, expected, 1e-6, "g")


@pytest.mark.parametrize("with_state", [False, True], ids=["zero_state", "init_state"])
@pytest.mark.parametrize("seq_len", [1, 63, 130], ids=lambda t: f"T{t}")
def test_recurrent_matches_transformers(seq_len, with_state):
    torch.manual_seed(6)
    batch, heads, k_dim, v_dim = 2, 2, 32, 16
    q_raw, k_raw = 3.0 * torch.randn(2, batch, seq_len, heads, k_dim)
    _, _, v, g, beta, state = make_inputs(batch, seq_len, heads, k_dim, v_dim, with_state)
    q, k = l2_normalize(q_raw), l2_normalize(k_raw)
    scale = 1 / math.sqrt(k_dim)

    out, final = kda_recurrent(q, k, v, g, beta, scale, state)
    hf_out, hf_final = hf_kimi.recurrent_kimi_delta_attention(
        q_raw, k_raw, v, g, beta, initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    assert_rel(out, hf_out, TOL, "recurrent output")
    assert_rel(final, hf_final, TOL, "recurrent final state")

    hf_out, hf_final = hf_kimi.chunk_kimi_delta_attention(
        q_raw,
        k_raw,
        v,
        g,
        beta,
        chunk_size=64,
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    assert_rel(out, hf_out, TOL, "chunk output")
    assert_rel(final, hf_final, TOL, "chunk final state")


def test_l2_normalize_uses_additive_eps():
    torch.manual_seed(7)
    x = torch.randn(4, 3, 16, dtype=torch.bfloat16)
    x[0, 0] = 0
    y = l2_normalize(x)
    assert y.dtype == torch.float32
    xf = x.double()
    assert_rel(y, xf / torch.sqrt((xf * xf).sum(-1, keepdim=True) + 1e-6), 1e-6, "l2")
    assert torch.equal(y[0, 0], torch.zeros(16))


def test_fresh_buffers_are_nan_filled():
    """The conftest fixture is active, so an output row a kernel never writes would fail ``assert_rel``."""
    assert torch.isnan(torch.empty(3)).all()


def test_chunked_with_gate_spikes_stays_close():
    """Rare huge gate logits (``g`` down to -1600 per token) lose precision in ``G_t - G_s``, but boundedly.

    The chunked form exponentiates differences of within-chunk cumulative sums, whose float32 rounding grows
    with their magnitude, so the tolerance here is looser than the 1e-5 of realistic gates.
    """
    torch.manual_seed(8)
    batch, seq_len, heads, k_dim, v_dim = 2, 96, 2, 16, 16
    q, k, v, _, beta, state = make_inputs(batch, seq_len, heads, k_dim, v_dim, with_state=True)
    logits = torch.randn(batch, seq_len, heads, k_dim)
    logits = torch.where(torch.rand_like(logits) < 0.02, torch.full_like(logits, 100.0), logits)
    g = kda_forget_gate(logits, torch.zeros(heads * k_dim), torch.log(torch.tensor([16.0, 2.0])))
    assert g.min() < -1000

    out_ref, final_ref = kda_recurrent(q, k, v, g, beta, k_dim**-0.5, state)
    for chunk_size in (16, 64):
        out, final = kda_chunked(q, k, v, g, beta, k_dim**-0.5, state, chunk_size=chunk_size)
        assert_rel(out, out_ref, 1e-4, f"c{chunk_size} output")
        assert_rel(final, final_ref, 1e-4, f"c{chunk_size} final state")
