"""Kimi Delta Attention layer, holding weights in transformers' names."""

import torch
from torch import nn

from services.engine.adapters.step_lora import StepLora, project
from services.engine.parallel.context import ParallelContext
from services.engine.parallel.row_parallel import row_parallel_project
from services.engine.parallel.shard import Shard

from .backends import KernelSet
from .config import ModelConfig
from .layer_cache import KdaLayerCache, ModelCache
from .norm import GatedRMSNorm
from .numerics import Numerics
from .step_metadata import StepMetadata


class KdaForgetGate(nn.Module):
    """Low-rank per-channel forget gate: ``g = -exp(A_log) * softplus(f_b(f_a(x)) + dt_bias)``.

    ``num_heads`` are the rank's heads (``f_b``, ``dt_bias``, ``A_log`` cut by the owning layer).
    """

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
    """KDA: short conv + SiLU on q/k/v, L2-normalised q/k, gated delta rule, gated RMSNorm output.

    Under TP a rank holds ``num_heads / tp`` heads: every per-head projection, the short conv's channels
    and the gate parameters are cut by head, ``o_proj`` is row-parallel, and the state slot holds only
    the rank's heads; ``f_a``, ``g_a`` and the output norm are whole on every rank.
    """

    def __init__(self, config: ModelConfig, parallel: ParallelContext):
        super().__init__()
        spec, self.parallel = config.kda, parallel
        heads = spec.num_heads // parallel.tp
        hidden, width = config.hidden_size, heads * spec.head_dim
        self.num_heads, self.head_dim, self.width = heads, spec.head_dim, width
        self.q_proj = nn.Linear(hidden, width, bias=False)
        self.k_proj = nn.Linear(hidden, width, bias=False)
        self.v_proj = nn.Linear(hidden, width, bias=False)
        self.conv1d = nn.Conv1d(3 * width, 3 * width, spec.conv_kernel_size, groups=3 * width, bias=False)
        self.forget_gate = KdaForgetGate(hidden, heads, spec.head_dim)
        self.b_proj = nn.Linear(hidden, heads, bias=False)
        self.g_a_proj = nn.Linear(hidden, spec.head_dim, bias=False)
        self.g_b_proj = nn.Linear(spec.head_dim, width, bias=False)
        self.o_norm = GatedRMSNorm(spec.head_dim, config.rms_norm_eps)
        self.o_proj = nn.Linear(width, hidden, bias=False)
        if parallel.tp > 1:
            rank, tp = parallel.tp_rank, parallel.tp
            column = Shard(0, rank, tp)
            self.parameter_shards = {
                **{f"{name}.weight": column for name in ("q_proj", "k_proj", "v_proj", "b_proj", "g_b_proj")},
                "conv1d.weight": Shard(0, rank, tp, blocks=3),
                "forget_gate.f_b_proj.weight": column,
                "forget_gate.dt_bias": column,
                "forget_gate.A_log": Shard(2, rank, tp),
                "o_proj.weight": Shard(1, rank, tp),
            }

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

        In a step with drafts (``meta.spec``) the speculative sequences' tails go first (beside every
        other sequence's rows), then this layer's fields of their slots are copied to their checkpoint
        slots, then their drafts run (``SpecSplit``).

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
        spec = meta.spec
        if spec is None:
            out = self._recurrence(mixed, g, beta, layer_cache, meta, nx, ops)
        else:
            heads, drafts = spec.head_rows, spec.draft_rows
            head_out = self._recurrence(mixed[heads], g[heads], beta[heads], layer_cache, spec.heads, nx, ops)
            spec.checkpoint(layer_cache)
            draft_out = self._recurrence(
                mixed[drafts], g[drafts], beta[drafts], layer_cache, spec.drafts, nx, ops
            )
            out = head_out.new_empty(tokens, *head_out.shape[1:])
            out[heads], out[drafts] = head_out, draft_out
        gate = project(project(x, self.g_a_proj, nx, lora), self.g_b_proj, nx, lora)
        normed = self.o_norm(out, gate.view(-1, self.num_heads, self.head_dim), nx).reshape(tokens, -1)
        return row_parallel_project(normed, self.o_proj, nx, lora, self.parallel)

    def _recurrence(
        self,
        mixed: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        cache: KdaLayerCache,
        meta: StepMetadata,
        nx: Numerics,
        ops: KernelSet,
    ) -> torch.Tensor:
        """Short conv, then the gated delta rule, over ``meta``'s rows: ``mixed [n, 3 * H * K]`` (q, k, v
        before the conv), ``g [n, H, K]``, ``beta [n, H]`` -> ``o [n, H, V]``."""
        mixed = ops.kda.short_conv(mixed, self.conv1d.weight.squeeze(1), cache, meta)
        heads = (-1, self.num_heads, self.head_dim)
        q, k, v = (part.reshape(heads) for part in mixed.split(self.width, dim=-1))
        q, k = nx.l2_normalize(q), nx.l2_normalize(k)
        return ops.kda.forward(q, k, v, g, beta, self.head_dim**-0.5, cache, meta)
