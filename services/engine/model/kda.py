"""Kimi Delta Attention layer, holding weights in transformers' names."""

import torch
from torch import nn

from kernels.conv.naive import causal_conv1d
from kernels.kda.chunk import kda_chunked
from kernels.kda.naive import kda_forget_gate, kda_recurrent, l2_normalize

from .config import ModelConfig
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
        """``x [B, T, D]`` -> log forget gate ``[B, T, H, K]`` float32."""
        logits = self.f_b_proj(self.f_a_proj(x)).view(*x.shape[:2], self.num_heads, self.head_dim)
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

    def forward(self, x: torch.Tensor, cache: KdaLayerState | None) -> tuple[torch.Tensor, KdaLayerState]:
        """Advance the recurrence over the new tokens.

        Args:
            x: ``[B, T, D]`` normalised hidden states.
            cache: conv and recurrent state after the previous tokens, or None at the start.

        Returns:
            ``(out [B, T, D], state after the new tokens)``.
        """
        batch, seq_len, _ = x.shape
        heads = (batch, seq_len, self.num_heads, self.head_dim)
        mixed = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        conv_initial, recurrent_initial = (None, None) if cache is None else (cache.conv, cache.recurrent)
        mixed, conv_state = causal_conv1d(mixed, self.conv1d.weight.squeeze(1), conv_initial)
        q, k, v = (part.reshape(heads) for part in mixed.split(self.width, dim=-1))
        q, k = l2_normalize(q), l2_normalize(k)
        g = self.forget_gate(x)
        beta = torch.sigmoid(self.b_proj(x))
        scale = self.head_dim**-0.5
        if seq_len == 1 and recurrent_initial is not None:
            out, recurrent = kda_recurrent(q, k, v, g, beta, scale, recurrent_initial)
        else:
            out, recurrent = kda_chunked(q, k, v, g, beta, scale, recurrent_initial, KDA_CHUNK_SIZE)
        gate = self.g_b_proj(self.g_a_proj(x)).view(heads)
        out = self.o_norm(out, gate).reshape(batch, seq_len, -1)
        return self.o_proj(out), KdaLayerState(conv=conv_state, recurrent=recurrent)
