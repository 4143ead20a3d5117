"""MoE expert backends: ``reference`` combines expert by expert in id order (``Numerics.moe_experts``;
a host loop over the experts present); ``triton`` runs ``moe_grouped`` (tokens sorted by expert, one
grouped GEMM, no host sync)."""

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from ..numerics import Numerics


class MoeBackend(ABC):
    """Routed experts; ``graph_safe`` when the forward never reads a device value back."""

    kind: str  # the backend name this implementation belongs to
    graph_safe: bool

    @abstractmethod
    def experts(
        self,
        x: torch.Tensor,
        expert_ids: torch.Tensor,
        weights: torch.Tensor,
        w_gate_up: torch.Tensor,
        w_down: torch.Tensor,
    ) -> torch.Tensor:
        """SwiGLU experts, weighted and summed per token.

        Args:
            x: ``[N, D]``; expert_ids: ``[N, k]``; weights: ``[N, k]`` float32;
            w_gate_up: ``[E, 2I, D]`` gate rows then up rows; w_down: ``[E, D, I]``.

        Returns:
            ``[N, D]`` in ``x.dtype``.
        """


class ReferenceMoe(MoeBackend):
    kind = "reference"
    graph_safe = False

    def __init__(self, nx: Numerics):
        self.nx = nx

    def experts(self, x, expert_ids, weights, w_gate_up, w_down):
        return self.nx.moe_experts(x, expert_ids, weights, w_gate_up, w_down)


class TritonMoe(MoeBackend):
    kind = "triton"
    graph_safe = True

    def __init__(self, moe_grouped: Callable):
        self.moe_grouped = moe_grouped

    def experts(self, x, expert_ids, weights, w_gate_up, w_down):
        return self.moe_grouped(x, expert_ids, weights, w_gate_up, w_down)
