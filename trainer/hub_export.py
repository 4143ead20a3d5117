"""A trained model written as a checkpoint folder Baton serves: hub tensor layout, bfloat16 safetensors in
bounded shards, ``config.json`` and the tokenizer's files beside them."""

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from services.engine.checkpoint.hub_layout import to_hub_layout
from services.engine.checkpoint.random_init import HEADER_BASE_BYTES, entry_bytes, write_shards
from services.engine.model.causal_lm import FLOAT32_PARAMETERS, CausalLM

# The files of a model folder that are not the tokenizer's (never copied from a tokenizer folder).
_MODEL_FILES = ("config.json", "model.safetensors.index.json")


def export_checkpoint(
    model: CausalLM, raw_config: dict[str, Any], tokenizer_dir: Path, out_dir: Path, max_shard_bytes: int
) -> list[Path]:
    """Write ``model``'s weights to ``out_dir`` as a loadable checkpoint; returns the safetensors files.

    Weights are stored in bfloat16, except ``FLOAT32_PARAMETERS`` (router weight and bias, KDA's
    ``dt_bias`` and ``A_log``), which the loader keeps in float32 whatever the model dtype. The tensors
    are in the hub layout (experts one tensor each, as released checkpoints), in shards of at most
    ``max_shard_bytes``; ``config.json`` is ``raw_config`` with ``torch_dtype`` ``bfloat16``.

    Raises:
        ValueError: a single tensor is larger than ``max_shard_bytes`` (naming ``--max-shard-mib``).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, tensor in model.state_dict().items():
        dtype = torch.float32 if name.endswith(FLOAT32_PARAMETERS) else torch.bfloat16
        tensors[name] = tensor.detach().to("cpu", dtype)
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight")
    named = list(to_hub_layout(tensors, model.config))
    for name, tensor in named:
        size = HEADER_BASE_BYTES + entry_bytes(name, tensor)
        if size > max_shard_bytes:
            raise ValueError(
                f"--max-shard-mib: tensor {name} alone needs a file of {size} bytes, over the shard limit of "
                f"{max_shard_bytes}; raise the limit"
            )
    write_shards(out_dir, iter(named), max_shard_bytes)
    config = {**raw_config, "torch_dtype": "bfloat16"}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for source in sorted(tokenizer_dir.iterdir()):
        if source.is_file() and source.suffix != ".safetensors" and source.name not in _MODEL_FILES:
            shutil.copyfile(source, out_dir / source.name)
    return sorted(out_dir.glob("*.safetensors"))
