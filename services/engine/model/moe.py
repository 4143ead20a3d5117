"""Feed-forward blocks: the dense SwiGLU MLP and the routed MoE with shared experts."""

import torch
from torch import nn

from kernels.moe.naive import route_tokens
from services.engine.adapters.step_lora import StepLora, project
from services.engine.parallel.context import ParallelContext
from services.engine.parallel.expert_parallel import expert_parallel_experts
from services.engine.parallel.row_parallel import row_parallel_project
from services.engine.parallel.shard import Shard

from .backends import KernelSet
from .config import MoeConfig
from .numerics import Numerics


class DenseMLP(nn.Module):
    """SwiGLU: ``down(silu(gate x) * up x)``; under TP a rank holds ``intermediate_size / tp`` channels
    (gate and up column-parallel, down row-parallel)."""

    def __init__(self, hidden_size: int, intermediate_size: int, parallel: ParallelContext):
        super().__init__()
        self.parallel = parallel
        local = intermediate_size // parallel.tp
        self.gate_proj = nn.Linear(hidden_size, local, bias=False)
        self.up_proj = nn.Linear(hidden_size, local, bias=False)
        self.down_proj = nn.Linear(local, hidden_size, bias=False)
        if parallel.tp > 1:
            column, row = Shard(0, parallel.tp_rank, parallel.tp), Shard(1, parallel.tp_rank, parallel.tp)
            self.parameter_shards = {
                "gate_proj.weight": column,
                "up_proj.weight": column,
                "down_proj.weight": row,
            }

    def forward(self, x: torch.Tensor, nx: Numerics, lora: StepLora | None = None) -> torch.Tensor:
        hidden = nx.silu(project(x, self.gate_proj, nx, lora)) * project(x, self.up_proj, nx, lora)
        return row_parallel_project(hidden, self.down_proj, nx, lora, self.parallel)


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
    """The rank's routed experts' weights, fused: ``gate_up_proj [E / ep, 2I, D]``, ``down_proj
    [E / ep, D, I]`` (all ``E`` at EP 1)."""

    def __init__(self, hidden_size: int, spec: MoeConfig, parallel: ParallelContext):
        super().__init__()
        local = spec.num_experts // parallel.ep
        self.gate_up_proj = nn.Parameter(torch.zeros(local, 2 * spec.intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.zeros(local, hidden_size, spec.intermediate_size))
        if parallel.ep > 1:
            by_expert = Shard(0, parallel.ep_rank, parallel.ep)
            self.parameter_shards = {"gate_up_proj": by_expert, "down_proj": by_expert}


class MoE(nn.Module):
    """Routed experts plus (optionally) always-on shared experts.

    The router is whole on every rank; the routed experts are sharded over the EP group
    (``expert_parallel``), replicated over TP ranks outside it; the shared experts are cut by TP.
    """

    def __init__(self, hidden_size: int, spec: MoeConfig, parallel: ParallelContext):
        super().__init__()
        self.parallel = parallel
        self.gate = Router(hidden_size, spec)
        self.experts = Experts(hidden_size, spec, parallel)
        self.shared_experts = (
            DenseMLP(hidden_size, spec.intermediate_size * spec.num_shared_experts, parallel)
            if spec.num_shared_experts
            else None
        )

    def forward(
        self, x: torch.Tensor, nx: Numerics, ops: KernelSet, lora: StepLora | None = None
    ) -> torch.Tensor:
        """``x [N, D]`` -> ``[N, D]``: routed experts (through ``ops.moe``) plus shared experts; ``lora``:
        the step's adapters (adapted rows' experts are recomputed, ``StepLora.experts``)."""
        weights, expert_ids = self.gate(x, nx)
        w_gate_up, w_down = self.experts.gate_up_proj, self.experts.down_proj
        if self.parallel.ep > 1:
            out = expert_parallel_experts(x, expert_ids, weights, w_gate_up, w_down, nx, self.parallel)
        else:
            out = ops.moe.experts(x, expert_ids, weights, w_gate_up, w_down)
        if lora is not None:
            out = lora.experts(self.experts, x, expert_ids, weights, out, nx)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x, nx, lora)
        return out
