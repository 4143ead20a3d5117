"""How the model computes: the fast default numerics, behind one small interface.

Layers hold weights and call a ``Numerics`` for every token-local computation that reduces or is
transcendental; the sequence-mixing ops (``causal_conv1d``, ``kda``, ``mla_attention``,
``indexer_scores``, ``moe_experts``) are called per sequence by the ``reference`` kernel backend
(``backends/``). ``InvariantNumerics`` (``invariant_numerics.py``) implements the same interface with
batch-invariant kernels (DESIGN.md section 4); the layer code is shared.
"""

import torch
import torch.nn.functional as F

from kernels.conv.naive import causal_conv1d
from kernels.dsa.naive import indexer_scores
from kernels.kda.chunk import kda_chunked
from kernels.kda.naive import kda_forget_gate, kda_recurrent, l2_normalize
from kernels.mla.naive import mla_attention_absorbed, mla_attention_expanded
from kernels.moe.naive import moe_experts
from kernels.norm.naive import gated_rms_norm, layer_norm, rms_norm
from kernels.rotary.naive import rope_cos_sin

KDA_CHUNK_SIZE = 64


class Numerics:
    """Default numerics: library kernels, the expanded MLA form for prefill, chunked KDA.

    Shapes: ``N`` tokens, ``T`` new tokens of one sequence, ``S`` its cached tokens, ``H`` heads.
    """

    batch_invariant = False

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``x [..., K] @ weight [M, K]^T`` in ``x.dtype``."""
        return F.linear(x, weight)

    def linear_f32(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``x [..., K] @ weight [M, K]^T`` with both widened to float32, accumulated and returned in
        float32 (the LoRA products of ``services.engine.adapters.merge``)."""
        return F.linear(x.to(torch.float32), weight.to(torch.float32))

    def rms_norm(self, x, weight, eps):
        return rms_norm(x, weight, eps)

    def gated_rms_norm(self, x, gate, weight, eps):
        return gated_rms_norm(x, gate, weight, eps)

    def l2_normalize(self, x):
        return l2_normalize(x)

    def layer_norm(self, x, weight, bias, eps):
        return layer_norm(x, weight, bias, eps)

    def silu(self, x):
        return F.silu(x)

    def sigmoid(self, x):
        return torch.sigmoid(x)

    def forget_gate(self, logits, dt_bias, a_log):
        """``[N, H, K]`` gate logits -> log forget gate, float32."""
        return kda_forget_gate(logits, dt_bias, a_log)

    def rope_cos_sin(self, positions, inv_freq, attention_factor, dtype):
        return rope_cos_sin(positions, inv_freq, attention_factor, dtype)

    def causal_conv1d(self, x, weight, state):
        """``x [T, D]``, ``weight [D, K]``, ``state [D, K - 1]`` or None -> ``(y [T, D], state)``."""
        y, new_state = causal_conv1d(x[None], weight, None if state is None else state[None])
        return y[0], new_state[0]

    def kda(self, q, k, v, g, beta, scale, previous):
        """One sequence's KDA over T tokens (``[T, H, *]``); ``previous`` is the ``[H, K, V]`` state or None.

        Returns ``(o [T, H, V], state)``; a single token with a state runs the recurrent form.
        """
        initial = None if previous is None else previous[None]
        args = (q[None], k[None], v[None], g[None], beta[None], scale, initial)
        if q.shape[0] == 1 and previous is not None:
            o, state = kda_recurrent(*args)
        else:
            o, state = kda_chunked(*args, KDA_CHUNK_SIZE)
        return o[0], state[0]

    def mla_attention(self, q_nope, q_rope, latent, k_rope, w_kv_b, scale, allowed, decoding):
        """One sequence's MLA: ``q [T, H, *]``, cache ``[S, *]``, ``allowed [T, S]`` -> ``[T, H, Dv]``.

        ``decoding`` (one new token after a prefix) uses the absorbed latent form, else expanded.
        """
        attend = mla_attention_absorbed if decoding else mla_attention_expanded
        return attend(q_nope[None], q_rope[None], latent[None], k_rope[None], w_kv_b, scale, allowed[None])[0]

    def indexer_scores(self, q, keys, weights, scale):
        """``q [T, Hi, Di]``, ``keys [S, Di]``, ``weights [T, Hi]`` -> ``[T, S]`` float32."""
        return indexer_scores(q[None], keys[None], weights[None], scale)[0]

    def router_scores(self, x, weight):
        """Sigmoid router probabilities ``[N, E]`` float32 from ``x [N, D]`` and ``weight [E, D]``."""
        return F.linear(x.float(), weight.float()).sigmoid()

    def moe_experts(self, x, expert_ids, weights, w_gate_up, w_down):
        return moe_experts(x, expert_ids, weights, w_gate_up, w_down)
