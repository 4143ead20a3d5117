"""Batch-invariant Triton kernels (matmul, norms, softmax, attention, indexer, MoE): each against its
float32 reference, and bitwise row invariance on CUDA when there is one, else under the interpreter.

``_assert_rows_invariant`` computes each of ``POOL`` rows alone, then inside batches of 1, 2, 3, 7 and
16 rows picked in shuffled order at several offsets (so a row sits at many positions next to many
neighbours), and compares bits (integer views), never values. The matmul is also checked across row
counts that straddle its BM-row tile (63, 64, 65, 130), with the row at the end of the batch.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kernels.invariant.attention import invariant_softmax
from kernels.invariant.attention_triton import mla_latent_attention_reference, mla_latent_attention_triton
from kernels.invariant.elementwise import fixed_exp, fixed_log, fixed_sigmoid, fixed_silu, fixed_softplus
from kernels.invariant.elementwise_triton import UNARY_OPS, unary_triton
from kernels.invariant.indexer_triton import indexer_scores_reference, indexer_scores_triton
from kernels.invariant.linear import tree_linear
from kernels.invariant.linear_triton import invariant_linear_triton, linear_tiles
from kernels.invariant.moe_triton import moe_experts_triton
from kernels.invariant.norm import (
    invariant_gated_rms_norm,
    invariant_l2_normalize,
    invariant_layer_norm,
    invariant_rms_norm,
)
from kernels.invariant.norm_triton import (
    gated_rms_norm_triton,
    l2_normalize_triton,
    layer_norm_triton,
    rms_norm_triton,
)
from kernels.invariant.softmax_triton import log_softmax_reference, log_softmax_triton, masked_softmax_triton
from kernels.moe.naive import moe_experts
from tests.kernels.kernel_testing import assert_rel

POOL = 16
BATCHES = (1, 2, 3, 7, 16)
EPS = 1e-5
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


def _assert_bitwise(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, what
    same = _bits(actual) == _bits(expected)
    assert same.numel() > 0, f"{what}: VACUOUS, nothing compared"
    assert bool(same.all()), f"{what}: {int((~same).sum())} of {same.numel()} elements differ in bits"


def _assert_rows_invariant(fn: Callable[[torch.Tensor], torch.Tensor], pool: torch.Tensor, seed: int) -> None:
    """``fn`` on rows of ``pool [POOL, ...]`` gives each row the same bits alone and in any batch."""
    alone = torch.cat([fn(pool[i : i + 1]) for i in range(pool.shape[0])])
    g = torch.Generator().manual_seed(seed)
    for size in BATCHES:
        for offset in (0, pool.shape[0] // 2):
            picked = torch.randperm(pool.shape[0], generator=g).roll(offset)[:size].to(pool.device)
            _assert_bitwise(fn(pool[picked]), alone[picked], f"batch of {size}, offset {offset}")


def _randn(*shape, dtype, device, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(device)


# ---- matmul ------------------------------------------------------------------------------------------

LINEAR_SHAPES = {"k40_n24": (40, 24), "k100_n70": (100, 70), "k16_n130": (16, 130)}


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("shape", LINEAR_SHAPES.values(), ids=LINEAR_SHAPES.keys())
def test_linear_matches_reference(shape, dtype, device):
    k, n = shape
    x = _randn(5, 3, k, dtype=dtype, device=device, seed=0)
    w = _randn(n, k, dtype=dtype, device=device, seed=1)
    want = tree_linear(x, w)
    got = invariant_linear_triton(x, w)
    assert got.dtype == dtype and got.shape == (5, 3, n)
    assert_rel(got.float(), want, TOL[dtype], "out")
    got32 = invariant_linear_triton(x, w, out_dtype=torch.float32)
    assert got32.dtype == torch.float32
    assert_rel(got32, want, 1e-5 if dtype == torch.float32 else 4e-3, "out float32")


def test_linear_strided_and_mixed_dtypes(device):
    """A transposed weight view (as the MLA absorption passes) and a bf16 x with a float32 weight."""
    x = _randn(7, 24, dtype=torch.float32, device=device, seed=2)
    w_t = _randn(24, 40, dtype=torch.float32, device=device, seed=3)
    assert_rel(invariant_linear_triton(x, w_t.transpose(0, 1)), tree_linear(x, w_t.t()), 1e-5, "strided w")
    xb = x.to(torch.bfloat16)
    got = invariant_linear_triton(xb, w_t.t(), out_dtype=torch.float32)
    assert_rel(got, tree_linear(xb, w_t.t()), 1e-5, "mixed dtypes")


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_linear_rows_bitwise_invariant(dtype, device):
    w = _randn(70, 100, dtype=dtype, device=device, seed=4)
    pool = _randn(POOL, 100, dtype=dtype, device=device, seed=5)
    _assert_rows_invariant(lambda rows: invariant_linear_triton(rows, w), pool, seed=6)
    _assert_rows_invariant(lambda rows: invariant_linear_triton(rows, w, torch.float32), pool, seed=7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_linear_bitwise_across_tile_padding(dtype, device):
    """One row at the end of batches of 1, 63, 64, 65 and 130 rows: last row of a full tile, first of a
    new one, alone in a mostly masked one. Also a strided x (a column slice) gives the same bits."""
    w = _randn(24, 40, dtype=dtype, device=device, seed=8)
    assert linear_tiles(24, 40, dtype)[0] == 64, "the cases below straddle BM = 64"
    row = _randn(1, 40, dtype=dtype, device=device, seed=9)
    alone = invariant_linear_triton(row, w)
    for m in (63, 64, 65, 130):
        batch = torch.cat([_randn(m - 1, 40, dtype=dtype, device=device, seed=m), row])
        _assert_bitwise(invariant_linear_triton(batch, w)[-1:], alone, f"last of {m} rows")
    wide = torch.cat([_randn(3, 40, dtype=dtype, device=device, seed=10), row]).repeat(1, 2)
    _assert_bitwise(invariant_linear_triton(wide[:, 40:], w)[-1:], alone, "strided x")


# ---- row norms ---------------------------------------------------------------------------------------

NORM_WIDTHS = {"d40": 40, "d130": 130}


def _norm_ops(d, dtype, device):
    """name -> (triton fn of x, reference fn of x) with the weights bound."""
    w = _randn(d, dtype=dtype, device=device, seed=11)
    b = _randn(d, dtype=dtype, device=device, seed=12)
    return {
        "rms": (lambda x: rms_norm_triton(x, w, EPS), lambda x: invariant_rms_norm(x, w, EPS)),
        "gated_rms": (
            lambda x: gated_rms_norm_triton(x, x.flip(-1), w, EPS),
            lambda x: invariant_gated_rms_norm(x, x.flip(-1), w, EPS),
        ),
        "layer": (lambda x: layer_norm_triton(x, w, b, EPS), lambda x: invariant_layer_norm(x, w, b, EPS)),
        "l2": (l2_normalize_triton, invariant_l2_normalize),
    }


NORMS = ("rms", "gated_rms", "layer", "l2")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("width", NORM_WIDTHS.values(), ids=NORM_WIDTHS.keys())
@pytest.mark.parametrize("op", NORMS)
def test_norm_matches_reference(op, width, dtype, device):
    fast, reference = _norm_ops(width, dtype, device)[op]
    x = _randn(4, 3, width, dtype=dtype, device=device, seed=13, scale=3.0)
    got, want = fast(x), reference(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert_rel(got.float(), want.float(), TOL[dtype], op)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("op", NORMS)
def test_norm_rows_bitwise_invariant(op, dtype, device):
    fast, _ = _norm_ops(130, dtype, device)[op]
    pool = _randn(POOL, 130, dtype=dtype, device=device, seed=14, scale=3.0)
    _assert_rows_invariant(fast, pool, seed=15)


# ---- softmax -----------------------------------------------------------------------------------------

VOCABS = {"v50": 50, "v300": 300}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("vocab", VOCABS.values(), ids=VOCABS.keys())
def test_log_softmax_matches_reference(vocab, dtype, device):
    logits = _randn(3, 2, vocab, dtype=dtype, device=device, seed=16, scale=5.0)
    assert_rel(log_softmax_triton(logits), log_softmax_reference(logits), 1e-5, "logprobs")


def test_log_softmax_rows_bitwise_invariant(device):
    pool = _randn(POOL, 300, dtype=torch.float32, device=device, seed=17, scale=5.0)
    _assert_rows_invariant(log_softmax_triton, pool, seed=18)


def _masked(rows: int, keys: int, device, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    scores = _randn(rows, keys, dtype=torch.float32, device=device, seed=seed, scale=3.0)
    g = torch.Generator().manual_seed(seed + 1)
    valid = (torch.rand(rows, keys, generator=g) > 0.3).to(device)
    valid[0] = False  # a row with nothing to attend to
    return scores.masked_fill(~valid, float("nan")), valid


def test_masked_softmax_matches_reference(device):
    scores, valid = _masked(6, 70, device, seed=19)
    got = masked_softmax_triton(scores, valid)
    assert_rel(got, invariant_softmax(scores, valid), 1e-5, "probs")
    assert bool((got[~valid] == 0).all()) and not bool(torch.signbit(got[~valid]).any()), "masked not +0.0"


def test_masked_softmax_bitwise_invariant_to_batch_and_key_padding(device):
    """Rows keep their bits in any batch, and when the key list grows with masked keys at its end (the
    attention case: one query over a short and over a padded key list)."""
    scores, valid = _masked(POOL, 70, device, seed=21)
    pool = torch.cat([scores, valid.to(scores.dtype)], -1)
    _assert_rows_invariant(lambda rows: masked_softmax_triton(rows[:, :70], rows[:, 70:] > 0), pool, seed=22)
    short = masked_softmax_triton(scores, valid)
    for extra in (1, 30, 5000):
        padded_scores = torch.cat([scores, torch.full((POOL, extra), float("nan"), device=device)], -1)
        padded_valid = torch.cat([valid, torch.zeros(POOL, extra, dtype=torch.bool, device=device)], -1)
        _assert_bitwise(masked_softmax_triton(padded_scores, padded_valid)[:, :70], short, f"+{extra} keys")


# ---- device errors -----------------------------------------------------------------------------------


def test_cpu_without_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = torch.zeros(2, 8)
    with pytest.raises(RuntimeError, match="invariant_linear_triton.*interpreter"):
        invariant_linear_triton(x, torch.zeros(4, 8))
    with pytest.raises(RuntimeError, match="rms_norm_triton"):
        rms_norm_triton(x, torch.ones(8), EPS)
    with pytest.raises(RuntimeError, match="log_softmax_triton"):
        log_softmax_triton(x)


# ---- latent attention --------------------------------------------------------------------------------

ATTENTION_SHAPES = {"h3_dc40_dr8": (3, 40, 8), "h20_dc32_dr16": (20, 32, 16)}  # heads, Dc, Dr


def _attention_inputs(heads, dc, dr, counts, device, seed, width=None):
    """Queries, a 70-key cache and per-query key lists: ``counts[t]`` sorted positions then -1 padding."""
    g = torch.Generator().manual_seed(seed)
    tokens, keys = len(counts), 70
    q_lat, q_rope = torch.randn(tokens, heads, dc, generator=g), torch.randn(tokens, heads, dr, generator=g)
    latent, k_rope = torch.randn(keys, dc, generator=g), torch.randn(keys, dr, generator=g)
    width = width or max(counts)
    index = torch.full((tokens, width), -1, dtype=torch.int64)
    for t, c in enumerate(counts):
        index[t, :c] = torch.sort(torch.randperm(keys, generator=g)[:c]).values
    tensors = (q_lat, q_rope, latent, k_rope)
    return (*(x.to(device) for x in tensors), index.to(device), torch.tensor(counts, device=device))


@pytest.mark.parametrize("shape", ATTENTION_SHAPES.values(), ids=ATTENTION_SHAPES.keys())
def test_latent_attention_matches_reference(shape, device):
    q_lat, q_rope, latent, k_rope, index, counts = _attention_inputs(
        *shape, [0, 1, 31, 32, 33, 70], device, 23
    )
    got = mla_latent_attention_triton(q_lat, q_rope, latent, k_rope, 0.3, index, counts)
    want = mla_latent_attention_reference(q_lat, q_rope, latent, k_rope, 0.3, index, counts)
    assert_rel(got, want, 1e-5, "out latent")
    assert bool((got[0] == 0).all()), "a query without keys is not zero"


def test_latent_attention_bitwise_invariant_to_batch_and_key_list_width(device):
    """A query's bits alone, inside batches of queries (any position), and with its key list padded to
    a wider batch: prefill (many queries) and decode (one) give the same bits."""
    counts = [1, 5, 17, 31, 32, 33, 40, 64, 70, 2, 9, 50, 66, 3, 45, 12]
    q_lat, q_rope, latent, k_rope, index, counts_t = _attention_inputs(20, 32, 16, counts, device, 24)

    def attend(rows: torch.Tensor) -> torch.Tensor:  # rows: query ids
        sub_counts = counts_t[rows]
        width = int(sub_counts.max())
        return mla_latent_attention_triton(
            q_lat[rows], q_rope[rows], latent, k_rope, 0.3, index[rows, :width], sub_counts
        )

    pool = torch.arange(len(counts), device=device)
    _assert_rows_invariant(attend, pool, seed=25)
    wide = torch.cat([index, torch.full((len(counts), 100), -1, device=device)], 1)
    padded = mla_latent_attention_triton(q_lat, q_rope, latent, k_rope, 0.3, wide, counts_t)
    _assert_bitwise(padded, attend(pool), "key lists padded by 100")


# ---- elementwise and indexer -------------------------------------------------------------------------

UNARY_REFERENCES = {
    "exp": fixed_exp,
    "log": fixed_log,
    "sigmoid": fixed_sigmoid,
    "silu": fixed_silu,
    "softplus": fixed_softplus,
    "cos": torch.cos,
    "sin": torch.sin,
}


@pytest.mark.parametrize("op", UNARY_OPS)
def test_unary_matches_reference_and_is_position_invariant(op, device):
    x = _randn(3, 700, dtype=torch.float32, device=device, seed=26, scale=8.0)
    x = x.abs() + 1e-3 if op == "log" else x
    assert_rel(unary_triton(op, x), UNARY_REFERENCES[op](x.cpu()).to(device), 1e-5, op)
    _assert_rows_invariant(lambda rows: unary_triton(op, rows), x.reshape(-1, 75)[:POOL], seed=27)
    rounded = unary_triton(op, x.to(torch.bfloat16), torch.bfloat16)
    assert rounded.dtype == torch.bfloat16
    assert_rel(rounded.float(), UNARY_REFERENCES[op](x.to(torch.bfloat16).float().cpu()).to(device), 1e-2, op)


def test_indexer_scores_match_reference_and_are_invariant(device):
    g = torch.Generator().manual_seed(28)
    q, keys = torch.randn(POOL, 4, 24, generator=g).to(device), torch.randn(70, 24, generator=g).to(device)
    weights = torch.randn(POOL, 4, generator=g).to(device)
    got = indexer_scores_triton(q, keys, weights, 0.2)
    assert_rel(got, indexer_scores_reference(q, keys, weights, 0.2), 1e-5, "scores")
    rows = torch.arange(POOL, device=device)
    _assert_rows_invariant(lambda r: indexer_scores_triton(q[r], keys, weights[r], 0.2), rows, seed=29)
    for count in (1, 31, 33, 69):  # fewer keys (an earlier step): the same bits for the keys seen
        short = indexer_scores_triton(q, keys[:count], weights, 0.2)
        _assert_bitwise(short, got[:, :count], f"{count} keys")


# ---- MoE ---------------------------------------------------------------------------------------------


def _moe_inputs(tokens, device, dtype, seed, experts=6, top_k=3, hidden=24, inter=40):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(dtype).to(device)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)]).to(device)
    weights = torch.rand(tokens, top_k, generator=g).to(device)
    w_gate_up = (torch.randn(experts, 2 * inter, hidden, generator=g) * hidden**-0.5).to(dtype).to(device)
    w_down = (torch.randn(experts, hidden, inter, generator=g) * inter**-0.5).to(dtype).to(device)
    return x, ids, weights, w_gate_up, w_down


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_moe_matches_reference(dtype, device):
    x, ids, weights, w_gate_up, w_down = _moe_inputs(9, device, dtype, seed=30)
    got = moe_experts_triton(x, ids, weights, w_gate_up, w_down)
    f32 = (t.float() for t in (x, w_gate_up, w_down))
    want = moe_experts(next(f32), ids, weights, next(f32), next(f32))
    assert got.dtype == dtype
    assert_rel(got.float(), want, TOL[dtype], "out")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_moe_bitwise_invariant_to_batch_and_choice_order(dtype, device):
    """A token's bits alone, in any batch (other tokens change which pairs share its GEMM blocks), and
    with its k choices listed in another order (the combine follows expert ids, not choice order)."""
    x, ids, weights, w_gate_up, w_down = _moe_inputs(POOL, device, dtype, seed=31)
    rows = torch.arange(POOL, device=device)
    _assert_rows_invariant(
        lambda r: moe_experts_triton(x[r], ids[r], weights[r], w_gate_up, w_down), rows, 32
    )
    flipped = moe_experts_triton(x, ids.flip(-1), weights.flip(-1), w_gate_up, w_down)
    _assert_bitwise(flipped, moe_experts_triton(x, ids, weights, w_gate_up, w_down), "choices reversed")
