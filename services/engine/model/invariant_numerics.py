"""Batch-invariant numerics: a token's bits never depend on what else is in the batch.

Every matrix product goes through ``fixed_linear`` (fixed 16-row tiles), every reduction is a
``tree_sum``, every transcendental a ``fixed_*`` op. Prefill and decode share one form per layer:
MLA always runs absorbed, each query over exactly the keys it may see, compacted in position order
(so a DSA selection and a causal prefix look the same to the reduction); KDA runs the CF-BI
fixed-chunk rows (``kernels.kda.fixed_chunk``); the short conv adds its taps in a fixed order.

``device_kernels`` picks who computes the products, norms, elementwise functions, latent attention,
indexer scores, MoE experts and the KDA rows: ``torch`` (the ``kernels.invariant`` ops above and
``kda_fixed_chunk``, the CPU path under MKL's strict mode) or ``triton`` (the fixed-tiling Triton
kernels ``kernels.invariant.*_triton``, the fast path on CUDA; on the CPU they run only under the
Triton interpreter). Both are batch-invariant;
they do not give each other's bits.
"""

import logging
from collections.abc import Callable
from typing import NamedTuple

import torch

from kernels.invariant import (
    fixed_elementwise,
    fixed_exp,
    fixed_linear,
    fixed_linear_is_invariant,
    fixed_sigmoid,
    fixed_silu,
    fixed_softplus,
    invariant_gated_rms_norm,
    invariant_l2_normalize,
    invariant_layer_norm,
    invariant_rms_norm,
    invariant_softmax,
    invariant_weighted_sum,
    tree_linear,
    tree_sum,
)
from kernels.invariant.reproducible_blas import ensure_strict_mkl
from kernels.kda.fixed_chunk import FixedChunkState, kda_fixed_chunk
from kernels.moe.naive import moe_experts

from .numerics import Numerics

log = logging.getLogger(__name__)

QUERY_BLOCK = 16  # queries per attention slab: bounds memory, cannot change a row's bits
_FIXED_UNARY = {
    "exp": fixed_exp,
    "sigmoid": fixed_sigmoid,
    "silu": fixed_silu,
    "softplus": fixed_softplus,
    "cos": lambda x: fixed_elementwise(torch.cos, x),
    "sin": lambda x: fixed_elementwise(torch.sin, x),
}
DEVICE_KERNELS = ("torch", "triton")


class InvariantNumerics(Numerics):
    """Same interface as ``Numerics``; see the module docstring for the guarantees.

    With ``device_kernels="torch"``, matrix products use ``fixed_linear`` where a probe shows this
    machine's GEMM keeps its rows invariant for that weight shape, else the slower ``tree_linear``
    (invariant by construction). On the CPU they run only under MKL's strict reproducible mode
    (``ensure_strict_mkl``), so that neither the thread count nor the CPU's kernel choice changes a
    row's bits. With ``device_kernels="triton"`` they, the row norms, the elementwise functions and the
    indexer scores run the fixed-tiling Triton kernels (invariant by construction, no probe), MLA
    attends in one launch (``mla_latent_attention_triton``) and the MoE experts run two grouped GEMMs
    and an expert-id-order combine (``moe_experts_triton``), and KDA runs the CF-BI rows in one launch
    per sequence (``kda_fixed_chunk_triton``). The short conv stays torch code in both.

    Raises:
        ValueError: an unknown ``device_kernels``.
    """

    batch_invariant = True

    def __init__(self, device_kernels: str = "torch"):
        if device_kernels not in DEVICE_KERNELS:
            raise ValueError(f"device_kernels: {device_kernels!r} is not one of {', '.join(DEVICE_KERNELS)}")
        self.device_kernels = device_kernels
        self._fixed_tiles_ok: dict[tuple, bool] = {}
        self._triton = _triton_ops() if device_kernels == "triton" else None

    def _product(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``x @ weight.T`` in float32."""
        if self._triton:
            return self._triton.linear(x, weight, torch.float32)
        key = (weight.device.type, tuple(weight.shape), weight.dtype)
        if key not in self._fixed_tiles_ok:
            if weight.device.type == "cpu":
                ensure_strict_mkl()  # the probe below holds across thread counts only in this mode
            self._fixed_tiles_ok[key] = fixed_linear_is_invariant(weight)
            if not self._fixed_tiles_ok[key]:
                log.warning(
                    "fixed-tile GEMM is not batch-invariant here for weight %s; using tree_linear", key
                )
        return fixed_linear(x, weight) if self._fixed_tiles_ok[key] else tree_linear(x, weight)

    def segment_products(self, x: torch.Tensor, weight: torch.Tensor, segments: int) -> torch.Tensor:
        """``[segments, N, M]`` float32 partial products of ``x [N, K] @ weight [M, K]^T`` over equal K
        segments (the row-parallel product, ``services.engine.parallel.row_parallel``): one invariant
        product per segment, so an entry's bits never depend on how many segments one rank holds."""
        pairs = zip(x.chunk(segments, -1), weight.chunk(segments, -1), strict=True)
        return torch.stack([self._product(xs, ws) for xs, ws in pairs])

    def linear(self, x, weight):
        if self._triton:  # rounds the float32 accumulator to x.dtype once, in the kernel
            return self._triton.linear(x, weight, x.dtype)
        return self._product(x, weight).to(x.dtype)

    def linear_f32(self, x, weight):
        return self._product(x.to(torch.float32), weight.to(torch.float32))

    def rms_norm(self, x, weight, eps):
        if self._triton:
            return self._triton.rms_norm(x, weight, eps)
        return invariant_rms_norm(x, weight, eps)

    def gated_rms_norm(self, x, gate, weight, eps):
        if self._triton:
            return self._triton.gated_rms_norm(x, gate, weight, eps)
        return invariant_gated_rms_norm(x, gate, weight, eps)

    def l2_normalize(self, x):
        if self._triton:
            return self._triton.l2_normalize(x)
        return invariant_l2_normalize(x)

    def layer_norm(self, x, weight, bias, eps):
        if self._triton:
            return self._triton.layer_norm(x, weight, bias, eps)
        return invariant_layer_norm(x, weight, bias, eps)

    def _elementwise(self, op: str, x: torch.Tensor) -> torch.Tensor:
        """``op(x)`` in float32, position-invariant: one Triton launch, or the ``fixed_*`` blocks."""
        if self._triton:
            return self._triton.unary(op, x)
        return _FIXED_UNARY[op](x)

    def silu(self, x):
        return self._elementwise("silu", x).to(x.dtype)

    def sigmoid(self, x):
        return self._elementwise("sigmoid", x).to(x.dtype)

    def forget_gate(self, logits, dt_bias, a_log):
        heads, k_dim = logits.shape[-2:]
        x = logits.to(torch.float32) + dt_bias.to(torch.float32).view(heads, k_dim)
        return -self._elementwise("exp", a_log.to(torch.float32).reshape(heads, 1)) * self._elementwise(
            "softplus", x
        )

    def rope_cos_sin(self, positions, inv_freq, attention_factor, dtype):
        angles = positions[..., None].to(torch.float32) * inv_freq.to(torch.float32)
        cos = self._elementwise("cos", angles) * attention_factor
        sin = self._elementwise("sin", angles) * attention_factor
        return cos.to(dtype), sin.to(dtype)

    def causal_conv1d(self, x, weight, state):
        taps = weight.shape[-1]
        xt = x.transpose(0, 1).to(weight.dtype)  # [D, T]
        if state is None:
            state = xt.new_zeros(xt.shape[0], taps - 1)
        padded = torch.cat([state.to(weight.dtype), xt], dim=-1)
        length = x.shape[0]
        total = weight[:, 0:1] * padded[:, 0:length]
        for tap in range(1, taps):
            total = total + weight[:, tap : tap + 1] * padded[:, tap : tap + length]
        y = self._elementwise("silu", total).to(x.dtype).transpose(0, 1)
        return y, padded[:, padded.shape[-1] - (taps - 1) :].contiguous()

    def kda(self, q, k, v, g, beta, scale, previous):
        if previous is None:
            previous = FixedChunkState.zeros(q.shape[1], q.shape[2], v.shape[2], q.device)
        if self._triton:
            o, state = self._triton.kda(q, k, v, g, beta, scale, previous)
        else:
            o, state = kda_fixed_chunk(q, k, v, g, beta, scale, previous)
        return o.to(v.dtype), state

    def mla_attention(self, q_nope, q_rope, latent, k_rope, w_kv_b, scale, allowed, decoding):
        heads, nope_dim = q_nope.shape[1], q_nope.shape[2]
        per_head = w_kv_b.reshape(heads, -1, w_kv_b.shape[-1])
        w_uk, w_uv = per_head[:, :nope_dim], per_head[:, nope_dim:]
        q_latent = torch.stack(
            [self._product(q_nope[:, h], w_uk[h].transpose(0, 1)) for h in range(heads)], 1
        )
        counts = allowed.sum(-1)
        width = int(counts.max())
        # Each query's visible keys in position order, then masked padding at the end.
        order = torch.sort(allowed.to(torch.int8), dim=-1, descending=True, stable=True).indices[:, :width]
        if self._triton:  # one launch: each query over its own keys, in fixed tiles in position order
            out_latent = self._triton.mla_latent_attention(
                q_latent, q_rope, latent, k_rope, scale, order, counts
            )
        else:
            out_latent = _latent_attention(q_latent, q_rope, latent, k_rope, scale, order, counts)
        out = torch.stack([self._product(out_latent[:, h], w_uv[h]) for h in range(heads)], 1)
        return out.to(q_nope.dtype)

    def indexer_scores(self, q, keys, weights, scale):
        if self._triton:
            return self._triton.indexer_scores(q, keys, weights, scale)
        dots = tree_sum(q.float()[:, :, None, :] * keys.float()[None, None], -1)  # [T, Hi, S]
        return tree_sum(weights.float()[:, :, None] * torch.relu(dots * scale), 1)

    def router_scores(self, x, weight):
        return self._elementwise("sigmoid", self._product(x.float(), weight.float()))

    def moe_experts(self, x, expert_ids, weights, w_gate_up, w_down):
        if self._triton:  # two fixed-tile grouped GEMMs, combined in expert-id order
            return self._triton.moe_experts(x, expert_ids, weights, w_gate_up, w_down)
        return moe_experts(x, expert_ids, weights, w_gate_up, w_down, linear=self.linear, silu=self.silu)


def _latent_attention(q_latent, q_rope, latent, k_rope, scale, order, counts) -> torch.Tensor:
    """Absorbed attention in the latent space from ``tree_sum`` and ``invariant_softmax``: ``[T, H, Dc]``
    float32 (the ``mla_latent_attention_triton`` contract), in ``QUERY_BLOCK``-query slabs."""
    valid = torch.arange(order.shape[1], device=order.device)[None, :] < counts[:, None]
    lat, rope = latent.to(torch.float32), k_rope.to(torch.float32)
    out_latent = []
    for start in range(0, q_latent.shape[0], QUERY_BLOCK):
        rows = slice(start, start + QUERY_BLOCK)
        keys_lat, keys_rope = lat[order[rows]], rope[order[rows]]  # [t, w, *]
        scores = tree_sum(q_latent[rows, :, None, :] * keys_lat[:, None], -1) + tree_sum(
            q_rope[rows].float()[:, :, None, :] * keys_rope[:, None], -1
        )
        probs = invariant_softmax(scores * scale, valid[rows, None, :])
        out_latent.append(invariant_weighted_sum(probs, keys_lat))
    return torch.cat(out_latent)


class _TritonOps(NamedTuple):
    """The invariant Triton kernels, imported only when asked for (Triton reads ``TRITON_INTERPRET``
    when a kernel module is imported)."""

    linear: Callable
    rms_norm: Callable
    gated_rms_norm: Callable
    l2_normalize: Callable
    layer_norm: Callable
    mla_latent_attention: Callable
    indexer_scores: Callable
    unary: Callable
    moe_experts: Callable
    kda: Callable


def _triton_ops() -> _TritonOps:
    from kernels.invariant.attention_triton import mla_latent_attention_triton
    from kernels.invariant.elementwise_triton import unary_triton
    from kernels.invariant.indexer_triton import indexer_scores_triton
    from kernels.invariant.kda_triton import kda_fixed_chunk_triton
    from kernels.invariant.linear_triton import invariant_linear_triton
    from kernels.invariant.moe_triton import moe_experts_triton
    from kernels.invariant.norm_triton import (
        gated_rms_norm_triton,
        l2_normalize_triton,
        layer_norm_triton,
        rms_norm_triton,
    )

    return _TritonOps(
        invariant_linear_triton,
        rms_norm_triton,
        gated_rms_norm_triton,
        l2_normalize_triton,
        layer_norm_triton,
        mla_latent_attention_triton,
        indexer_scores_triton,
        unary_triton,
        moe_experts_triton,
        kda_fixed_chunk_triton,
    )
