"""Write random checkpoints: a ``config.json``, safetensors in the hub or transformers layout, a tokenizer."""

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from services.engine.model.causal_lm import CausalLM
from services.engine.model.config import ModelConfig
from services.engine.model.config_loader import load_model_config

from .hub_layout import to_hub_layout

LAYOUTS = ("hub", "transformers")
# A safetensors header's bytes beyond the tensor names, bounded from above: the length prefix, the
# metadata and the padding per file; the JSON of dtype, shape and offsets per tensor.
HEADER_BASE_BYTES = 128
_HEADER_ENTRY_BYTES = 128


def init_random_weights(model: CausalLM, seed: int) -> None:
    """Fill every parameter from a seeded generator, as the reference models initialise them.

    Matrices get ``N(0, 1 / fan_in)``, norms one, KDA's ``A_log`` ``log U(1, 16)`` and ``dt_bias`` the
    inverse softplus of ``U_log(1e-3, 1e-1)``; the router's selection bias is small and non-zero so
    that routing exercises it.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(_initial_value(name, param, generator))


def _initial_value(name: str, param: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    shape = param.shape
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    if name.endswith("k_norm.bias"):
        return torch.zeros(shape)
    if name.endswith("A_log"):
        return torch.empty(shape).uniform_(1.0, 16.0, generator=generator).log()
    if name.endswith("dt_bias"):
        dt = torch.empty(shape).uniform_(math.log(1e-3), math.log(1e-1), generator=generator).exp()
        return dt + torch.log(-torch.expm1(-dt))
    if name.endswith("e_score_correction_bias"):
        return torch.randn(shape, generator=generator) * 0.01
    fan_in = shape[-1] if len(shape) > 1 else 1
    return torch.randn(shape, generator=generator) * fan_in**-0.5


def write_random_checkpoint(
    out_dir: Path,
    raw_config: dict[str, Any],
    seed: int,
    layout: str = "hub",
    max_shard_bytes: int | None = None,
) -> ModelConfig:
    """Build a random model for ``raw_config`` and write it as a checkpoint folder.

    Args:
        out_dir: created if missing; ``config.json`` and ``*.safetensors`` are (over)written.
        raw_config: the ``config.json`` dict (validated first).
        seed: weight seed; the same seed gives the same bytes.
        layout: ``"hub"`` (one tensor per expert, as released checkpoints) or ``"transformers"``.
        max_shard_bytes: split into several files plus ``model.safetensors.index.json``.

    Returns:
        The validated config.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"--layout: unknown layout {layout!r} (choose from {', '.join(LAYOUTS)})")
    config = load_model_config(raw_config)
    model = CausalLM(config)
    init_random_weights(model, seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = dict(model.state_dict())
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight")
    named = to_hub_layout(tensors, config) if layout == "hub" else iter(tensors.items())
    write_shards(out_dir, named, max_shard_bytes)
    (out_dir / "config.json").write_text(json.dumps(raw_config, indent=2, sort_keys=True) + "\n")
    return config


def entry_bytes(name: str, tensor: torch.Tensor) -> int:
    """An upper bound on what ``name``'s tensor adds to a safetensors file: its data and header entry."""
    return tensor.numel() * tensor.element_size() + len(name.encode()) + _HEADER_ENTRY_BYTES


def write_shards(
    out_dir: Path, named: Iterator[tuple[str, torch.Tensor]], max_shard_bytes: int | None
) -> None:
    """Write ``named`` tensors as ``model.safetensors``, or as numbered files of at most
    ``max_shard_bytes`` each, header included (a tensor larger than that alone in its file), plus
    ``model.safetensors.index.json``; stale ``*.safetensors`` in ``out_dir`` are removed first."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = HEADER_BASE_BYTES
    for name, tensor in named:
        nbytes = entry_bytes(name, tensor)
        if max_shard_bytes and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = HEADER_BASE_BYTES
        shards[-1][name] = tensor.contiguous()
        size += nbytes
    for stale in out_dir.glob("*.safetensors"):
        stale.unlink()
    if len(shards) == 1:
        save_file(shards[0], str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        (out_dir / "model.safetensors.index.json").unlink(missing_ok=True)
        return
    weight_map = {}
    for number, shard in enumerate(shards, start=1):
        file_name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out_dir / file_name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file_name))
    index = {"metadata": {}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
