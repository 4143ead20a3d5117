"""MLA references: absorbed (latent) form vs expanded form vs an explicit per-head loop."""

from __future__ import annotations

import pytest
import torch

from kernels.mla.naive import mla_attention_absorbed, mla_attention_expanded
from tests.kernels.kernel_testing import assert_rel, rel_err

TOL = 1e-5
NOPE, ROPE, VDIM, LATENT = 16, 8, 12, 32


def causal_allowed(batch: int, queries: int, keys: int) -> torch.Tensor:
    """Query t sits at position ``keys - queries + t`` and sees keys up to it."""
    q_pos = torch.arange(keys - queries, keys)[:, None]
    return (torch.arange(keys)[None, :] <= q_pos).expand(batch, queries, keys).clone()


def sparse_allowed(batch: int, queries: int, keys: int, keep: float = 0.3) -> torch.Tensor:
    """Random masks (a DSA top-k selection stand-in) where every row keeps at least one key."""
    allowed = torch.rand(batch, queries, keys) < keep
    forced = torch.randint(keys, (batch, queries, 1))
    allowed.scatter_(-1, forced, True)
    return allowed


MASKS = {  # name: (T, S, mask builder)
    "prefill_causal": (9, 9, causal_allowed),
    "chunked_prefill_causal": (5, 14, causal_allowed),
    "decode_T1": (1, 37, causal_allowed),
    "sparse_prefill": (9, 9, sparse_allowed),
    "sparse_decode_T1": (1, 37, sparse_allowed),
    "sparse_chunk": (6, 23, sparse_allowed),
}


def make_inputs(batch: int, queries: int, keys: int, heads: int):
    q_nope = torch.randn(batch, queries, heads, NOPE)
    q_rope = torch.randn(batch, queries, heads, ROPE)
    latent = torch.randn(batch, keys, LATENT)
    k_rope = torch.randn(batch, keys, ROPE)
    w_kv_b = torch.randn(heads * (NOPE + VDIM), LATENT) * LATENT**-0.5
    return q_nope, q_rope, latent, k_rope, w_kv_b


def per_head_loop(q_nope, q_rope, latent, k_rope, w_kv_b, scale, allowed) -> torch.Tensor:
    """Build each head's keys and values explicitly and run plain softmax attention, in float64."""
    batch, queries, heads, _ = q_nope.shape
    w = w_kv_b.double().reshape(heads, NOPE + VDIM, LATENT)
    out = torch.zeros(batch, queries, heads, VDIM, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            keys = torch.cat([latent[b].double() @ w[h, :NOPE].T, k_rope[b].double()], dim=-1)  # [S, Dn + Dr]
            values = latent[b].double() @ w[h, NOPE:].T  # [S, Dv]
            query = torch.cat([q_nope[b, :, h], q_rope[b, :, h]], dim=-1).double()  # [T, Dn + Dr]
            scores = (query @ keys.T * scale).masked_fill(~allowed[b], float("-inf"))
            out[b, :, h] = torch.softmax(scores, dim=-1) @ values
    return out


@pytest.mark.parametrize("heads", [1, 4, 16], ids=lambda h: f"H{h}")
@pytest.mark.parametrize("mask", list(MASKS), ids=list(MASKS))
def test_absorbed_expanded_and_loop_agree(mask, heads):
    torch.manual_seed(0)
    queries, keys, build = MASKS[mask]
    inputs = make_inputs(2, queries, keys, heads)
    allowed = build(2, queries, keys)
    assert allowed.any(-1).all()
    scale = (NOPE + ROPE) ** -0.5

    expanded = mla_attention_expanded(*inputs, scale, allowed)
    absorbed = mla_attention_absorbed(*inputs, scale, allowed)
    reference = per_head_loop(*inputs, scale, allowed)

    assert expanded.shape == absorbed.shape == (2, queries, heads, VDIM)
    assert_rel(absorbed, expanded, TOL, "absorbed vs expanded")
    assert_rel(expanded, reference, TOL, "expanded vs loop")
    assert_rel(absorbed, reference, TOL, "absorbed vs loop")
    if not allowed.all():  # the mask must matter, or this case tests nothing about masking
        unmasked = per_head_loop(*inputs, scale, torch.ones_like(allowed))
        assert rel_err(unmasked, reference) > 1e-2


def test_disallowed_keys_do_not_leak():
    """Changing latents and rope keys that a row may not see leaves that row's output unchanged."""
    torch.manual_seed(1)
    queries, keys, heads = 4, 20, 4
    q_nope, q_rope, latent, k_rope, w_kv_b = make_inputs(1, queries, keys, heads)
    allowed = sparse_allowed(1, queries, keys)
    hidden = ~allowed[0, 0]  # keys row 0 cannot see
    assert hidden.any()
    latent2, k_rope2 = latent.clone(), k_rope.clone()
    latent2[0, hidden] = 1e3 * torch.randn(int(hidden.sum()), LATENT)
    k_rope2[0, hidden] = 1e3 * torch.randn(int(hidden.sum()), ROPE)
    for fn in (mla_attention_expanded, mla_attention_absorbed):
        a = fn(q_nope, q_rope, latent, k_rope, w_kv_b, 0.2, allowed)
        b = fn(q_nope, q_rope, latent2, k_rope2, w_kv_b, 0.2, allowed)
        assert rel_err(b[:, 0], a[:, 0]) <= 1e-6, fn.__name__


def test_batch_rows_are_independent():
    torch.manual_seed(2)
    inputs = make_inputs(3, 5, 17, 4)
    allowed = sparse_allowed(3, 5, 17)
    for fn in (mla_attention_expanded, mla_attention_absorbed):
        out = fn(*inputs, 0.2, allowed)
        for i in range(3):
            out_i = fn(*(t[i : i + 1] if t.dim() > 2 else t for t in inputs), 0.2, allowed[i : i + 1])
            assert rel_err(out[i : i + 1], out_i) <= 1e-6, f"{fn.__name__} row {i}"
