"""Convert model parameters to the released checkpoints' ("hub") tensor names and split experts.

The inverse of ``tensor_names.NameMapper``; used to write hub-layout checkpoints for tests.
"""

import re
from collections.abc import Iterator

import torch

from services.engine.model.config import ModelConfig

_FORGET_GATE = re.compile(r"\.self_attn\.forget_gate\.")
_CONV = re.compile(r"\.self_attn\.conv1d\.weight$")
_GATE_UP = re.compile(r"\.(?:mlp|block_sparse_moe)\.experts\.gate_up_proj$")
_DOWN = re.compile(r"\.(?:mlp|block_sparse_moe)\.experts\.down_proj$")


def to_hub_layout(
    tensors: dict[str, torch.Tensor], config: ModelConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hub name, tensor)`` for every parameter.

    Kimi families (``kimi_linear``, ``k3``): ``mlp`` -> ``block_sparse_moe``, experts as ``w1/w3/w2``,
    ``conv1d`` split into ``q/k/v_conv1d``, forget-gate tensors directly under ``self_attn``.
    DeepSeek: experts as ``gate_proj/up_proj/down_proj``.
    """
    kimi = config.family != "deepseek_v32"
    gate, up, down = ("w1", "w3", "w2") if kimi else ("gate_proj", "up_proj", "down_proj")
    for name, tensor in tensors.items():
        if kimi:
            name = _FORGET_GATE.sub(".self_attn.", name).replace(".mlp.", ".block_sparse_moe.")
        if _CONV.search(name):
            for part, chunk in zip("qkv", tensor.chunk(3, dim=0), strict=True):
                yield name.replace("conv1d.weight", f"{part}_conv1d.weight"), chunk
        elif _GATE_UP.search(name):
            prefix = name.removesuffix("gate_up_proj")
            for expert, weight in enumerate(tensor):
                gate_rows, up_rows = weight.chunk(2, dim=0)
                yield f"{prefix}{expert}.{gate}.weight", gate_rows
                yield f"{prefix}{expert}.{up}.weight", up_rows
        elif _DOWN.search(name):
            prefix = name.removesuffix("down_proj")
            for expert, weight in enumerate(tensor):
                yield f"{prefix}{expert}.{down}.weight", weight
        else:
            yield name, tensor
