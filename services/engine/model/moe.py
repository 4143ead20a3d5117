"""Feed-forward blocks: the dense SwiGLU MLP and the routed MoE with shared experts."""

import torch
from torch import nn

from kernels.moe.naive import route_tokens
from services.engine.adapters.step_lora import StepLora, project

from .backends import KernelSet
from .config import MoeConfig
from .numerics import Numerics


class DenseMLP(nn.Module):
    """SwiGLU: ``down(silu(gate x) * up x)``."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor, nx: Numerics, lora: StepLora | None = None) -> torch.Tensor:
        hidden = nx.silu(project(x, self.gate_proj, nx, lora)) * project(x, self.up_proj, nx, lora)
        return project(hidden, self.down_proj, nx, lora)


class Router(nn.Module):
    """Sigmoid router with a selection bias; weights kept in float32 (``weight [E, D]``)."""

    def __init__(self, hidden_size: int, spec: MoeConfig):
        super().__init__()
        self.spec = spec
        self.weight = nn.Parameter(torch.zeros(spec.num_experts, hidden_size, dtype=torch.float32))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(spec.num_experts, dtype=torch.float32))

    def forward(self, x: torch.Tensor, nx: Numerics) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [N, D]`` -> ``(weights [N, k] float32, expert_ids [N, k])``."""
        s = self.spec
        return route_tokens(
            nx.router_scores(x, self.weight),
            self.e_score_correction_bias,
            s.num_experts_per_tok,
            s.n_group,
            s.topk_group,
            s.norm_topk_prob,
            s.routed_scaling_factor,
        )


class Experts(nn.Module):
    """All routed experts' weights, fused: ``gate_up_proj [E, 2I, D]``, ``down_proj [E, D, I]``."""

    def __init__(self, hidden_size: int, spec: MoeConfig):
        super().__init__()
        self.gate_up_proj = nn.Parameter(
            torch.zeros(spec.num_experts, 2 * spec.intermediate_size, hidden_size)
        )
        self.down_proj = nn.Parameter(torch.zeros(spec.num_experts, hidden_size, spec.intermediate_size))


class MoE(nn.Module):
    """Routed experts plus (optionally) always-on shared experts."""

    def __init__(self, hidden_size: int, spec: MoeConfig):
        super().__init__()
        self.gate = Router(hidden_size, spec)
        self.experts = Experts(hidden_size, spec)
        self.shared_experts = (
            DenseMLP(hidden_size, spec.intermediate_size * spec.num_shared_experts)
            if spec.num_shared_experts
            else None
        )

    def forward(
        self, x: torch.Tensor, nx: Numerics, ops: KernelSet, lora: StepLora | None = None
    ) -> torch.Tensor:
        """``x [N, D]`` -> ``[N, D]``: routed experts (through ``ops.moe``) plus shared experts; ``lora``:
        the step's adapters (adapted rows' experts are recomputed, ``StepLora.experts``)."""
        weights, expert_ids = self.gate(x, nx)
        out = ops.moe.experts(x, expert_ids, weights, self.experts.gate_up_proj, self.experts.down_proj)
        if lora is not None:
            out = lora.experts(self.experts, x, expert_ids, weights, out, nx)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x, nx, lora)
        return out
