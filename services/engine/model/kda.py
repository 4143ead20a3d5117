"""Kimi Delta Attention layer, holding weights in transformers' names."""

import torch
from torch import nn

from services.engine.adapters.step_lora import StepLora, project

from .backends import KernelSet
from .config import ModelConfig
from .layer_cache import ModelCache
from .norm import GatedRMSNorm
from .numerics import Numerics
from .step_metadata import StepMetadata


class KdaForgetGate(nn.Module):
    """Low-rank per-channel forget gate: ``g = -exp(A_log) * softplus(f_b(f_a(x)) + dt_bias)``."""

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        self.f_a_proj = nn.Linear(hidden_size, head_dim, bias=False)
        self.f_b_proj = nn.Linear(head_dim, num_heads * head_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.zeros(num_heads * head_dim))
        self.A_log = nn.Parameter(torch.zeros(1, 1, num_heads, 1))

    def forward(self, x: torch.Tensor, nx: Numerics, lora: StepLora | None = None) -> torch.Tensor:
        """``x [N, D]`` -> log forget gate ``[N, H, K]`` float32."""
        logits = project(project(x, self.f_a_proj, nx, lora), self.f_b_proj, nx, lora)
        return nx.forget_gate(
            logits.view(x.shape[0], self.num_heads, self.head_dim), self.dt_bias, self.A_log
        )


class KimiDeltaAttention(nn.Module):
    """KDA: short conv + SiLU on q/k/v, L2-normalised q/k, gated delta rule, gated RMSNorm output."""

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

    def forward(
        self,
        x: torch.Tensor,
        meta: StepMetadata,
        cache: ModelCache,
        layer: int,
        nx: Numerics,
        ops: KernelSet,
        lora: StepLora | None = None,
    ) -> torch.Tensor:
        """Advance every sequence's recurrence over its new rows, continuing its state slot in place.

        Args:
            x: ``[N, D]`` normalised hidden states of the step's new tokens.
            meta: the step.
            cache: the model cache; this layer's index is ``layer``.
            nx: numerics of the token-local work.
            ops: the kernel backends (short conv and KDA).
            lora: the step's adapters (``services.engine.adapters``), or None.

        Returns:
            ``[N, D]``.
        """
        tokens = x.shape[0]
        mixed = torch.cat([project(x, p, nx, lora) for p in (self.q_proj, self.k_proj, self.v_proj)], dim=-1)
        g = self.forget_gate(x, nx, lora)
        beta = nx.sigmoid(project(x, self.b_proj, nx, lora))
        layer_cache = cache.kda(layer)
        mixed = ops.kda.short_conv(mixed, self.conv1d.weight.squeeze(1), layer_cache, meta)
        heads = (-1, self.num_heads, self.head_dim)
        q, k, v = (part.reshape(heads) for part in mixed.split(self.width, dim=-1))
        q, k = nx.l2_normalize(q), nx.l2_normalize(k)
        out = ops.kda.forward(q, k, v, g, beta, self.head_dim**-0.5, layer_cache, meta)
        gate = project(project(x, self.g_a_proj, nx, lora), self.g_b_proj, nx, lora).view(heads)
        return project(self.o_norm(out, gate, nx).reshape(tokens, -1), self.o_proj, nx, lora)
