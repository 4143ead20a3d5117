"""Random-weight models built directly on the device: real per-layer shapes, no checkpoint on disk.

``baton bench`` uses them to measure kernels at the sizes that matter (``--preset full --layers N``):
a few layers of Kimi-Linear-48B-A3B or of the K3 shape take tens of GB, which is quicker to fill
with random numbers on the GPU than to write and read back as safetensors.
"""

import math

import torch

from services.engine.model.causal_lm import CausalLM
from services.engine.model.config_loader import load_model_config

from .loader import build_empty_model
from .presets import preset_config, with_layers


@torch.no_grad()
def build_random_model(
    family: str,
    preset: str,
    device: str,
    dtype: torch.dtype,
    layers: int | None = None,
    seed: int = 0,
) -> CausalLM:
    """A model of the preset's shapes with random weights, allocated and filled on ``device``.

    Weights follow ``random_init``'s distributions (matrices ``N(0, 1 / fan_in)``, norms one, KDA's
    ``A_log`` and ``dt_bias`` in their usual ranges, a small router bias), drawn by a generator on
    the device, so the same seed gives the same weights on the same kind of device.

    Args:
        family: ``kimi_linear``, ``k3`` or ``deepseek_v32``.
        preset: ``tiny``, ``small`` or ``full``.
        device: where the weights are made.
        dtype: parameter dtype (router and gate parameters stay float32).
        layers: layer count (``with_layers``); None keeps the preset's.
        seed: weight seed.

    Raises:
        ValueError: an unknown family or preset, or a bad ``layers`` (naming the flag).
    """
    raw = preset_config(family, preset)
    if layers is not None:
        raw = with_layers(raw, layers)
    model = build_empty_model(load_model_config(raw), device, dtype)
    generator = torch.Generator(device=device).manual_seed(seed)
    for name, param in model.named_parameters():
        _fill(name, param, generator)
    return model.eval()


def _fill(name: str, param: torch.Tensor, generator: torch.Generator) -> None:
    if name.endswith("norm.weight"):
        param.fill_(1.0)
    elif name.endswith("k_norm.bias"):
        param.zero_()
    elif name.endswith("A_log"):
        param.uniform_(1.0, 16.0, generator=generator).log_()
    elif name.endswith("dt_bias"):
        dt = torch.empty_like(param, dtype=torch.float32)
        dt.uniform_(math.log(1e-3), math.log(1e-1), generator=generator).exp_()
        param.copy_(dt + torch.log(-torch.expm1(-dt)))
    elif name.endswith("e_score_correction_bias"):
        param.normal_(0.0, 0.01, generator=generator)
    else:
        param.normal_(0.0, (param.shape[-1] if param.dim() > 1 else 1) ** -0.5, generator=generator)
