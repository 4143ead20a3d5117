"""Test helpers: LoRA adapters written in PEFT's on-disk layout (by hand: ``peft`` is not a dependency),
and a float32 reference that merges the deltas into a copy of the base weights."""

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from services.engine.checkpoint.loader import load_model
from services.engine.checkpoint.tensor_names import NameMapper

# Hub module names PEFT would target: attention projections (MLA, KDA, indexer) and every expert's.
TARGETS = re.compile(
    r"model\.layers\.\d+\.(?:self_attn\.(?:q_proj|k_proj|v_proj|o_proj|b_proj|g_a_proj|g_b_proj|f_a_proj"
    r"|f_b_proj|q_a_proj|q_b_proj|kv_a_proj_with_mqa|indexer\.wq_b|indexer\.wk)"
    r"|block_sparse_moe\.(?:experts\.\d+\.w[123]|shared_experts\.\w+_proj|gate_proj|up_proj|down_proj)"
    r"|mlp\.(?:experts\.\d+\.\w+_proj|shared_experts\.\w+_proj|gate_proj|up_proj|down_proj))$"
)


def base_shapes(model_dir: Path) -> dict[str, tuple[int, int]]:
    """Hub module name -> ``(out, in)`` of every 2-D weight in the checkpoint."""
    shapes = {}
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            for key in handle.keys():
                shape = handle.get_slice(key).get_shape()
                if key.endswith(".weight") and len(shape) == 2:
                    shapes[key.removesuffix(".weight")] = tuple(shape)
    return shapes


def write_peft_adapter(
    folder: Path,
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]],
    rank: int,
    alpha: float,
    **config,
) -> Path:
    """Write ``adapter_config.json`` and ``adapter_model.safetensors`` as PEFT's ``save_pretrained`` does."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    body = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": sorted({name.rsplit(".", 1)[-1] for name in pairs}),
        "use_rslora": False,
        "bias": "none",
        "modules_to_save": None,
        **config,
    }
    (folder / "adapter_config.json").write_text(json.dumps(body))
    tensors = {}
    for module, (a, b) in pairs.items():
        tensors[f"base_model.model.{module}.lora_A.weight"] = a.contiguous()
        tensors[f"base_model.model.{module}.lora_B.weight"] = b.contiguous()
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


def random_pairs(model_dir: Path, rank: int = 4, seed: int = 0, scale: float = 0.3, pattern=TARGETS):
    """Random ``(A, B)`` for every module of ``model_dir`` matching ``pattern`` (B nonzero, unlike PEFT's
    initialisation, so the adapter changes the output)."""
    generator = torch.Generator().manual_seed(seed)
    pairs = {}
    for module, (out_features, in_features) in sorted(base_shapes(model_dir).items()):
        if pattern.match(module):
            a = torch.randn(rank, in_features, generator=generator) * scale / in_features**0.5
            b = torch.randn(out_features, rank, generator=generator) * scale / rank**0.5
            pairs[module] = (a, b)
    return pairs


def merged_reference_model(model_dir: Path, adapters: list[tuple[dict, float]]):
    """The base model in float32 with ``W += scaling * B @ A`` (float64 product) for each adapter's pairs:
    the plain reference for served-with-adapter logits (the engine never merges)."""
    model = load_model(model_dir, device="cpu", dtype=torch.float32)
    parameters = dict(model.named_parameters())
    mapper = NameMapper(model.config, set(parameters))
    with torch.no_grad():
        for pairs, scaling in adapters:
            for module, (a, b) in pairs.items():
                target = mapper.resolve(module + ".weight")
                delta = (scaling * (b.double() @ a.double())).float()
                view = parameters[target.parameter]
                if target.expert is not None:
                    view = view[target.expert]
                if target.rows is not None:
                    view = view[target.rows[0] : target.rows[1]]
                view += delta
    return model
