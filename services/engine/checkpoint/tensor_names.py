"""Explicit mapping from checkpoint tensor names to the model's parameters.

Two on-disk layouts are understood, both name for name:

- **transformers layout** (what ``save_pretrained`` of transformers 5 writes): names equal the
  model's parameter names, experts fused as ``mlp.experts.gate_up_proj [E, 2I, D]`` and
  ``mlp.experts.down_proj [E, D, I]``.
- **hub layout** (what the released checkpoints ship): one tensor per expert, and for Kimi-Linear
  ``block_sparse_moe`` instead of ``mlp``, ``w1/w3/w2`` for gate/up/down, separate ``q/k/v_conv1d``
  and the forget-gate tensors directly under ``self_attn``.

A hub tensor lands in a slice of a fused parameter; ``Target`` says which.
"""

import re
from dataclasses import dataclass

from services.engine.model.config import ModelConfig


@dataclass(frozen=True)
class Target:
    """Where one checkpoint tensor goes: ``parameter[expert][rows]`` (each part optional)."""

    parameter: str
    expert: int | None = None
    rows: tuple[int, int] | None = None

    def overlaps(self, other: "Target") -> bool:
        """True when both write some element of the same parameter."""
        if self.parameter != other.parameter:
            return False
        if self.expert is not None and other.expert is not None and self.expert != other.expert:
            return False
        if self.rows is None or other.rows is None:
            return True
        return self.rows[0] < other.rows[1] and other.rows[0] < self.rows[1]

    def describe(self) -> str:
        parts = self.parameter
        if self.expert is not None:
            parts += f"[expert {self.expert}]"
        if self.rows is not None:
            parts += f"[rows {self.rows[0]}:{self.rows[1]}]"
        return parts


_LAYER = r"model\.layers\.(\d+)\."
_EXPERT = re.compile(_LAYER + r"mlp\.experts\.(\d+)\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$")
_EXPERT_PART = {
    "w1": "gate",
    "w3": "up",
    "w2": "down",
    "gate_proj": "gate",
    "up_proj": "up",
    "down_proj": "down",
}
_KIMI_CONV = re.compile(_LAYER + r"self_attn\.([qkv])_conv1d\.weight$")
_KIMI_GATE = re.compile(r"\.self_attn\.(f_a_proj\.weight|f_b_proj\.weight|dt_bias|A_log)$")
_ANY_LAYER = re.compile(_LAYER)


class NameMapper:
    """Resolves checkpoint tensor names for one model.

    Args:
        config: the model config (expert and KDA sizes, MTP layer count).
        parameters: the model's parameter names.
    """

    def __init__(self, config: ModelConfig, parameters: set[str]):
        self.config = config
        self.parameters = parameters
        self.moe_rows = config.moe.intermediate_size if config.moe else 0
        self.kda_width = config.kda.num_heads * config.kda.head_dim if config.kda else 0

    def is_skipped(self, name: str) -> bool:
        """True for tensors the engine deliberately does not load: multi-token-prediction layers
        (indices ``num_hidden_layers ..``), used later as a speculative draft."""
        match = _ANY_LAYER.match(name)
        if not match:
            return False
        index = int(match.group(1))
        first_mtp = self.config.num_hidden_layers
        return first_mtp <= index < first_mtp + self.config.num_nextn_predict_layers

    def resolve(self, name: str) -> Target | None:
        """The destination of checkpoint tensor ``name``, or None when the name is unexpected."""
        # Kimi's hub names: the feed-forward block is `block_sparse_moe`, the forget gate is flat.
        name = name.replace(".block_sparse_moe.", ".mlp.")
        name = _KIMI_GATE.sub(r".self_attn.forget_gate.\1", name)
        if name in self.parameters:
            return Target(name)
        if m := _EXPERT.match(name):
            prefix = f"model.layers.{m.group(1)}."
            return self._expert_target(prefix, int(m.group(2)), _EXPERT_PART[m.group(3)])
        if m := _KIMI_CONV.match(name):
            part = "qkv".index(m.group(2))
            target = Target(
                f"model.layers.{m.group(1)}.self_attn.conv1d.weight",
                None,
                (part * self.kda_width, (part + 1) * self.kda_width),
            )
            return target if target.parameter in self.parameters else None
        return None

    def _expert_target(self, prefix: str, expert: int, which: str) -> Target | None:
        if self.config.moe is None or not 0 <= expert < self.config.moe.num_experts:
            return None
        rows = self.moe_rows
        if which == "down":
            return self._known(prefix + "mlp.experts.down_proj", expert)
        span = (0, rows) if which == "gate" else (rows, 2 * rows)
        target = self._known(prefix + "mlp.experts.gate_up_proj", expert)
        return None if target is None else Target(target.parameter, expert, span)

    def _known(self, parameter: str, expert: int | None = None) -> Target | None:
        return Target(parameter, expert) if parameter in self.parameters else None
