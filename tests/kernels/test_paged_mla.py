"""Paged absorbed-MLA attention: the Triton kernel (interpreter on CPU) against its float32 reference,
and the reference against today's per-sequence math (``mla_attention_absorbed`` with a mask)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: the kernels run on CPU

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.mla import paged_naive, paged_triton  # noqa: E402
from kernels.mla.naive import mla_attention_absorbed  # noqa: E402
from tests.kernels.kernel_testing import assert_rel  # noqa: E402
from tests.kernels.paged_testing import build_cache, random_topk, step_queries  # noqa: E402

DC, DR, DI, NOPE, VDIM = 32, 16, 16, 8, 8
SCALE = (NOPE + DR) ** -0.5
TOL = 1e-4

CASES = {  # name: (sequence lengths, block size, step pieces (seq, first position, count), heads)
    "decode_ragged_B4_H4": ([1, 17, 40], 4, [(0, 0, 1), (1, 16, 1), (2, 39, 1)], 4),
    "chunk_after_prefix_B8_H2": ([20, 5, 31], 8, [(0, 13, 7), (1, 0, 5), (2, 30, 1)], 2),
    "mixed_order_B16_H3": ([33, 9], 16, [(1, 8, 1), (0, 25, 8)], 3),
}


def make_step(case: str, fp8: bool, seed: int = 0, dtype: torch.dtype = torch.float32):
    torch.manual_seed(seed)
    lengths, block, pieces, heads = CASES[case]
    cache = build_cache(lengths, block, (DC, DR, DI), dtype, fp8)
    query_seq, query_pos = step_queries(pieces)
    tokens = query_seq.numel()
    q_latent, q_rope = torch.randn(tokens, heads, DC).to(dtype), torch.randn(tokens, heads, DR).to(dtype)
    return cache, query_seq, query_pos, q_latent, q_rope, max(lengths)


def check_against_reference(fast, slow, what: str, tol: float = TOL) -> None:
    (out, lse), (want_out, want_lse) = fast, slow
    assert out.dtype == want_out.dtype and lse.dtype == torch.float32
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse)), f"{what}: rows with nothing attended differ"
    assert_rel(out, want_out, tol, f"{what} out")
    finite = torch.isfinite(want_lse)
    assert_rel(lse[finite], want_lse[finite], tol, f"{what} lse")


@pytest.mark.parametrize("mode", ["dense", "sparse"])
@pytest.mark.parametrize("fmt", ["fp32", "fp8", "bf16", "bf16_fp8rows"])
@pytest.mark.parametrize("case", list(CASES))
def test_triton_matches_reference(case, fmt, mode):
    dtype = torch.bfloat16 if fmt.startswith("bf16") else torch.float32
    cache, query_seq, query_pos, q_latent, q_rope, max_len = make_step(case, "fp8" in fmt, dtype=dtype)
    topk = random_topk(query_pos, 12, seed=1) if mode == "sparse" else None
    if topk is not None:
        topk[0] = -1  # a query with nothing selected: zeros and lse -inf
    args = (
        q_latent,
        q_rope,
        cache.latent,
        cache.rope,
        cache.block_tables,
        query_seq,
        query_pos,
        topk,
        SCALE,
        max_len,
    )
    want = paged_naive.paged_mla_decode(*args)
    tol = TOL if dtype == torch.float32 else 2e-2
    check_against_reference(paged_triton.paged_mla_decode(*args), want, "decode", tol)
    check_against_reference(paged_triton.paged_mla_prefill(*args), want, "prefill", tol)
    if topk is not None:
        assert torch.isinf(want[1][0]).all() and (want[0][0] == 0).all()


@pytest.mark.parametrize("fmt", ["fp32", "fp8"])
@pytest.mark.parametrize("rope_dim", [8, 24], ids=["Dr8", "Dr24"])
def test_rope_width_that_is_no_power_of_two_above_16_is_padded(rope_dim, fmt):
    """The tiny presets have Dr = 8: the kernel pads the rope part with masked loads."""
    torch.manual_seed(0)
    lengths, block, pieces, heads = CASES["chunk_after_prefix_B8_H2"]
    cache = build_cache(lengths, block, (DC, rope_dim, DI), torch.float32, fmt == "fp8")
    query_seq, query_pos = step_queries(pieces)
    q_latent, q_rope = (
        torch.randn(query_seq.numel(), heads, DC),
        torch.randn(query_seq.numel(), heads, rope_dim),
    )
    args = (q_latent, q_rope, cache.latent, cache.rope, cache.block_tables, query_seq, query_pos)
    for topk in (None, random_topk(query_pos, 12, seed=1)):
        want = paged_naive.paged_mla_decode(*args, topk, SCALE, max(lengths))
        got = paged_triton.paged_mla_decode(*args, topk, SCALE, max(lengths))
        check_against_reference(got, want, f"Dr={rope_dim} {'dense' if topk is None else 'sparse'}")


@pytest.mark.parametrize("num_splits", [1, 2, 7], ids=["direct", "splits2", "splits7_some_empty"])
def test_split_count_does_not_change_the_result(num_splits):
    cache, query_seq, query_pos, q_latent, q_rope, max_len = make_step("chunk_after_prefix_B8_H2", False)
    args = (
        q_latent,
        q_rope,
        cache.latent,
        cache.rope,
        cache.block_tables,
        query_seq,
        query_pos,
        None,
        SCALE,
        max_len,
    )
    check_against_reference(
        paged_triton.paged_mla_decode(*args, num_splits=num_splits),
        paged_naive.paged_mla_decode(*args),
        "split",
    )


@pytest.mark.parametrize("num_splits", [1, 20], ids=["direct", "splits20_two_combine_chunks"])
@pytest.mark.parametrize("heads_minor", [False, True], ids=["heads_major", "heads_minor"])
@pytest.mark.parametrize("fmt", ["fp32", "fp8"])
@pytest.mark.parametrize("mode", ["dense", "sparse"])
def test_tile_forms_agree(mode, fmt, heads_minor, num_splits):
    """Both matrix forms of the split kernel (the GPU picks per format), whole-block and per-row key
    tiles (block 16 vs 8 rows), and a split count above the combine kernel's 16-split chunk."""
    case = "mixed_order_B16_H3" if mode == "dense" else "chunk_after_prefix_B8_H2"
    cache, query_seq, query_pos, q_latent, q_rope, max_len = make_step(case, fmt == "fp8")
    topk = random_topk(query_pos, 12, seed=3) if mode == "sparse" else None
    args = (
        q_latent,
        q_rope,
        cache.latent,
        cache.rope,
        cache.block_tables,
        query_seq,
        query_pos,
        topk,
        SCALE,
        max_len,
    )
    config = paged_triton.MlaKernelConfig(block_n=16, num_warps=4, num_stages=1, heads_minor=heads_minor)
    check_against_reference(
        paged_triton.paged_mla_decode(*args, num_splits=num_splits, config=config),
        paged_naive.paged_mla_decode(*args),
        "tile form",
    )


@pytest.mark.parametrize("mode", ["dense", "sparse"])
@pytest.mark.parametrize("case", list(CASES))
def test_reference_matches_per_sequence_absorbed_mla(case, mode):
    """The paged reference, with W_UK folded into the query and W_UV applied to its output, equals
    ``mla_attention_absorbed`` over each sequence's gathered rows with a causal / top-k mask."""
    cache, query_seq, query_pos, _, q_rope, max_len = make_step(case, False)
    heads = q_rope.shape[1]
    q_nope = torch.randn(q_rope.shape[0], heads, NOPE)
    w_kv_b = torch.randn(heads * (NOPE + VDIM), DC) * DC**-0.5
    per_head = w_kv_b.reshape(heads, NOPE + VDIM, DC)
    w_uk, w_uv = per_head[:, :NOPE], per_head[:, NOPE:]
    q_latent = torch.einsum("thd,hdc->thc", q_nope, w_uk)
    topk = random_topk(query_pos, 10, seed=2) if mode == "sparse" else None
    out, _ = paged_naive.paged_mla_decode(
        q_latent,
        q_rope,
        cache.latent,
        cache.rope,
        cache.block_tables,
        query_seq,
        query_pos,
        topk,
        SCALE,
        max_len,
    )
    got = torch.einsum("thc,hdc->thd", out, w_uv)
    for t in range(query_seq.numel()):
        seq, pos = int(query_seq[t]), int(query_pos[t])
        keys = cache.rows_latent[seq].shape[0]
        allowed = torch.arange(keys) <= pos
        if topk is not None:
            allowed = torch.zeros(keys, dtype=torch.bool)
            allowed[topk[t][topk[t] >= 0].long()] = True
        want = mla_attention_absorbed(
            q_nope[t][None, None], q_rope[t][None, None], cache.rows_latent[seq][None],
            cache.rows_rope[seq][None], w_kv_b, SCALE, allowed[None, None],
        )[0, 0]  # fmt: skip
        assert_rel(got[t], want, 1e-5, f"query {t}")


def test_lse_merges_partial_results():
    """Two disjoint halves of a query's keys, merged through their lse, equal attention over all of them."""
    cache, query_seq, query_pos, q_latent, q_rope, max_len = make_step("decode_ragged_B4_H4", False)
    last = slice(2, 3)  # the query at position 39
    everything = torch.randperm(40)[None].to(torch.int32)
    args = (q_latent[last], q_rope[last], cache.latent, cache.rope, cache.block_tables, query_seq[last])
    halves = [
        paged_triton.paged_mla_decode(*args, query_pos[last], part.contiguous(), SCALE, max_len)
        for part in (everything[:, :23], everything[:, 23:])
    ]
    whole_out, whole_lse = paged_triton.paged_mla_decode(*args, query_pos[last], everything, SCALE, max_len)
    lse = torch.logsumexp(torch.stack([h[1] for h in halves]), dim=0)
    out = sum(torch.exp(h[1] - lse)[..., None] * h[0] for h in halves)
    assert_rel(lse, whole_lse, TOL, "merged lse")
    assert_rel(out, whole_out, TOL, "merged out")


def test_empty_step_returns_empty_outputs():
    cache, *_ = make_step("decode_ragged_B4_H4", False)
    none = torch.zeros(0, dtype=torch.int32)
    out, lse = paged_triton.paged_mla_decode(
        torch.zeros(0, 2, DC), torch.zeros(0, 2, DR), cache.latent, cache.rope, cache.block_tables,
        none, none, None, SCALE, 40,
    )  # fmt: skip
    assert out.shape == (0, 2, DC) and lse.shape == (0, 2)


def test_cpu_tensors_without_the_interpreter_are_a_clear_error(monkeypatch):
    cache, query_seq, query_pos, q_latent, q_rope, max_len = make_step("decode_ragged_B4_H4", False)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        paged_triton.paged_mla_decode(
            q_latent,
            q_rope,
            cache.latent,
            cache.rope,
            cache.block_tables,
            query_seq,
            query_pos,
            None,
            SCALE,
            max_len,
        )


@pytest.mark.parametrize(
    "bad, match",
    [
        ("rope_with_fp8", "rope_cache must be None"),
        ("odd_latent_dim", "power of two"),
        ("int64_table", "int32"),
    ],
)
def test_bad_input_names_the_argument(bad, match):
    fp8 = bad == "rope_with_fp8"
    cache, query_seq, query_pos, q_latent, q_rope, max_len = make_step("decode_ragged_B4_H4", fp8)
    latent, rope, tables = cache.latent, cache.rope, cache.block_tables
    if bad == "rope_with_fp8":
        rope = torch.zeros(*latent.shape[:2], DR)
    if bad == "odd_latent_dim":
        q_latent, latent, rope = q_latent[..., :24], latent[..., :24], rope
    if bad == "int64_table":
        tables = tables.long()
    with pytest.raises(ValueError, match=match):
        paged_triton.paged_mla_decode(
            q_latent, q_rope, latent, rope, tables, query_seq, query_pos, None, SCALE, max_len
        )
