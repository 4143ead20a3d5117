"""Kimi Delta Attention layer, holding weights in transformers' names."""

import torch
from torch import nn

from kernels.conv.naive import causal_conv1d
from kernels.kda.chunk import kda_chunked
from kernels.kda.naive import kda_forget_gate, kda_recurrent, l2_normalize

from .config import ModelConfig
from .forward_batch import ForwardBatch, ModelCache
from .norm import GatedRMSNorm
from .state import KdaLayerState

KDA_CHUNK_SIZE = 64


class KdaForgetGate(nn.Module):
    """Low-rank per-channel forget gate: ``g = -exp(A_log) * softplus(f_b(f_a(x)) + dt_bias)``."""

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        self.f_a_proj = nn.Linear(hidden_size, head_dim, bias=False)
        self.f_b_proj = nn.Linear(head_dim, num_heads * head_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.zeros(num_heads * head_dim))
        self.A_log = nn.Parameter(torch.zeros(1, 1, num_heads, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [N, D]`` -> log forget gate ``[N, H, K]`` float32."""
        logits = self.f_b_proj(self.f_a_proj(x)).view(x.shape[0], self.num_heads, self.head_dim)
        return kda_forget_gate(logits, self.dt_bias, self.A_log)


class KimiDeltaAttention(nn.Module):
    """KDA: short conv + SiLU on q/k/v, L2-normalised q/k, gated delta rule, gated RMSNorm output.

    Prefill runs the chunked form; a single-token step with a cached state runs the recurrent form.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        spec = config.kda
        hidden, width = config.hidden_size, spec.num_heads * spec.head_dim
        self.num_heads, self.head_dim, self.width = spec.num_heads, spec.head_dim, width
        self.q_proj = nn.Linear(hidden, width, bias=False)
        self.k_proj = nn.Linear(hidden, width, bias=False)
        self.v_proj = nn.Linear(hidden, width, bias=False)
        self.conv1d = nn.Conv1d(3 * width, 3 * width, spec.conv_kernel_size, groups=3 * width, bias=False)
        self.forget_gate = KdaForgetGate(hidden, spec.num_heads, spec.head_dim)
        self.b_proj = nn.Linear(hidden, spec.num_heads, bias=False)
        self.g_a_proj = nn.Linear(hidden, spec.head_dim, bias=False)
        self.g_b_proj = nn.Linear(spec.head_dim, width, bias=False)
        self.o_norm = GatedRMSNorm(spec.head_dim, config.rms_norm_eps)
        self.o_proj = nn.Linear(width, hidden, bias=False)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: ModelCache, layer: int) -> torch.Tensor:
        """Advance each sequence's recurrence over its new tokens, reading and writing its cached state.

        Args:
            x: ``[N, D]`` normalised hidden states of the batch's new tokens.
            batch: which rows belong to which sequence.
            cache: per-sequence cache; this layer's index is ``layer``.

        Returns:
            ``[N, D]``.
        """
        tokens = x.shape[0]
        mixed = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        g = self.forget_gate(x)
        beta = torch.sigmoid(self.b_proj(x))
        scale = self.head_dim**-0.5
        heads = (1, -1, self.num_heads, self.head_dim)
        out = torch.empty(tokens, self.num_heads, self.head_dim, dtype=x.dtype, device=x.device)
        for seq, piece in enumerate(batch.sequences):
            rows = piece.rows
            previous = cache.read_kda(layer, seq)
            conv_initial = None if previous is None else previous.conv[None]
            recurrent_initial = None if previous is None else previous.recurrent[None]
            mixed_seq, conv_state = causal_conv1d(
                mixed[rows][None], self.conv1d.weight.squeeze(1), conv_initial
            )
            q, k, v = (part.reshape(heads) for part in mixed_seq.split(self.width, dim=-1))
            q, k = l2_normalize(q), l2_normalize(k)
            g_seq, beta_seq = g[rows][None], beta[rows][None]
            if piece.length == 1 and recurrent_initial is not None:
                o, recurrent = kda_recurrent(q, k, v, g_seq, beta_seq, scale, recurrent_initial)
            else:
                o, recurrent = kda_chunked(q, k, v, g_seq, beta_seq, scale, recurrent_initial, KDA_CHUNK_SIZE)
            cache.write_kda(layer, seq, KdaLayerState(conv=conv_state[0], recurrent=recurrent[0]))
            out[rows] = o[0]
        gate = self.g_b_proj(self.g_a_proj(x)).view(tokens, self.num_heads, self.head_dim)
        return self.o_proj(self.o_norm(out, gate).reshape(tokens, -1))
