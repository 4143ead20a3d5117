"""Backends for a step of equal-length fresh windows: every sequence at once, not one at a time.

The ``reference`` backends loop over a step's sequences from its host copies, which on a GPU makes a
pretraining step of B windows B times as many small kernel launches. A pretraining step is uniform:
B fresh sequences of T tokens each, packed in order, kept in a ``TrainingCache``. These backends run
the same ``kernels/*/naive.py`` and chunked-KDA code over ``[B, T, ...]`` views of the packed rows:

* KDA: ``causal_conv1d`` and ``kda_chunked`` with a batch of B and no initial state;
* the DSA indexer: ``indexer_scores`` over ``[B, T, T]``, causal, the same stable top-k order as the
  reference (higher score first, then lower position);
* MLA: ``mla_attention_expanded`` with a ``[B, T, T]`` mask (causal, or the DSA selection).

Same math, batched: results agree with the reference backends to float32 rounding, not bitwise
(``tests/trainer/test_window_loss.py``). The MoE and sampling families keep the model's own backends
(the MoE reference already runs a step's rows together). Any other step is refused.
"""

import torch

from kernels.conv.naive import causal_conv1d
from kernels.dsa.naive import indexer_scores
from kernels.kda.chunk import kda_chunked
from kernels.mla.naive import mla_attention_expanded
from services.engine.model.backends.attention import AttentionBackend, selection_mask
from services.engine.model.backends.indexer import IndexerBackend
from services.engine.model.backends.kda import KdaBackend
from services.engine.model.backends.kernel_set import KernelSet
from services.engine.model.causal_lm import CausalLM
from services.engine.model.numerics import KDA_CHUNK_SIZE
from services.engine.model.step_metadata import StepMetadata

WINDOW_KERNELS = "windows"


def window_shape(meta: StepMetadata) -> tuple[int, int]:
    """``(B, T)`` of a step of B fresh sequences of T tokens each.

    Raises:
        ValueError: a sequence has a past or another length.
    """
    count = meta.num_seqs
    length = meta.seq_len(0)
    uniform = all(meta.seq_len(s) == length and meta.past_lens_host[s] == 0 for s in range(count))
    if not uniform:
        raise ValueError("window kernels: the step must be fresh sequences of one length (trainer windows)")
    return count, length


def _stacked(cache, count: int, length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The step's cached rows as ``[B, T, *]`` (latent, k_rope, index keys or None)."""
    rows = [cache.gather((seq,), length) for seq in range(count)]
    keys = None if rows[0][2] is None else torch.stack([r[2] for r in rows])
    return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows]), keys


class WindowKda(KdaBackend):
    """Short conv and chunked KDA over ``[B, T]`` (fresh windows: no state read or kept)."""

    kind = WINDOW_KERNELS
    graph_safe = False

    def short_conv(self, x, weight, cache, meta):
        count, length = window_shape(meta)
        out, _ = causal_conv1d(x.view(count, length, -1), weight, None)
        return out.reshape(x.shape)

    def forward(self, q, k, v, g, beta, scale, cache, meta):
        count, length = window_shape(meta)

        def windows(x):
            return x.reshape(count, length, *x.shape[1:])

        out, _ = kda_chunked(
            windows(q), windows(k), windows(v), windows(g), windows(beta), scale, None, KDA_CHUNK_SIZE
        )
        return out.reshape(v.shape)


class WindowIndexer(IndexerBackend):
    """DSA top-k of every window's rows in one score tensor."""

    kind = WINDOW_KERNELS
    graph_safe = False

    def topk(self, q, weights, cache, meta, topk, scale):
        count, length = window_shape(meta)
        _, _, keys = _stacked(cache, count, length)
        scores = indexer_scores(
            q.view(count, length, *q.shape[1:]), keys, weights.view(count, length, -1), scale
        )
        visible = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
        masked = scores.masked_fill(~visible, float("-inf"))
        order = torch.sort(masked, dim=-1, descending=True, stable=True).indices[..., :topk]
        picked = torch.where(visible.expand(count, -1, -1).gather(-1, order), order, -1)
        out = torch.full((q.shape[0], topk), -1, dtype=torch.int32, device=q.device)
        out[:, : picked.shape[-1]] = picked.reshape(q.shape[0], -1).to(torch.int32)
        return out


class WindowAttention(AttentionBackend):
    """Expanded MLA of every window at once, causal or over the DSA selection."""

    kind = WINDOW_KERNELS
    graph_safe = False

    def forward(self, q_nope, q_rope, w_kv_b, cache, meta, topk_positions, scale):
        count, length = window_shape(meta)
        latent, k_rope, _ = _stacked(cache, count, length)
        if topk_positions is None:
            causal = torch.ones(length, length, dtype=torch.bool, device=q_nope.device).tril()
            allowed = causal.expand(count, -1, -1)
        else:
            allowed = selection_mask(topk_positions, length).view(count, length, length)

        def windows(x):
            return x.view(count, length, *x.shape[1:])

        out = mla_attention_expanded(windows(q_nope), windows(q_rope), latent, k_rope, w_kv_b, scale, allowed)
        return out.reshape(q_nope.shape[0], *out.shape[2:])


def use_window_kernels(model: CausalLM) -> CausalLM:
    """Give ``model`` (default numerics) the window backends for KDA, the indexer and MLA; returns it.

    Only ``window_logits``-shaped steps run then (``window_shape``); ``model.set_kernels`` restores
    a serving backend.
    """
    if model.numerics.batch_invariant:
        raise ValueError("model: window kernels run the default numerics; call set_batch_invariant(False)")
    kernels = model.kernels
    model.kernels = KernelSet(
        WINDOW_KERNELS, WindowAttention(), WindowIndexer(), WindowKda(), kernels.moe, kernels.sampling
    )
    return model
