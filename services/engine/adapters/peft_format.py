"""Read a LoRA adapter in PEFT's on-disk format, without depending on ``peft``.

A folder holds ``adapter_config.json`` (``peft_type: LORA``, ``r``, ``lora_alpha``, ``target_modules``,
``use_rslora``, ...) and ``adapter_model.safetensors`` with one pair per adapted module::

    base_model.model.<module>.lora_A.weight    [r, in_features]
    base_model.model.<module>.lora_B.weight    [out_features, r]

``<module>`` is the module's name in the transformers model (``model.layers.3.self_attn.q_proj``,
``model.layers.1.block_sparse_moe.experts.0.w1``, ...). Per-module ranks (``rank_pattern``,
``alpha_pattern``) are honoured; features this engine does not implement (``modules_to_save``, DoRA,
biases on the LoRA layers, layer replication) are refused with an error naming the field.
"""

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_KEY = re.compile(r"^base_model\.model\.(.+)\.lora_([AB])(?:\.default)?\.weight$")


class AdapterError(ValueError):
    """An adapter that cannot be loaded; the message names the file, field or tensor at fault."""


@dataclass(frozen=True)
class PeftLora:
    """An adapter folder's contents, checked for format but not yet against a model.

    Attributes:
        rank: the default ``r``.
        alpha: the default ``lora_alpha``.
        use_rslora: scaling ``alpha / sqrt(r)`` instead of ``alpha / r``.
        rank_pattern, alpha_pattern: per-module overrides (PEFT's: a key matches a module whose name
            ends with it, or as a regex).
        pairs: ``module name -> (A [r, in], B [out, r])`` as stored.
        digest: identifies the folder's contents (salts the prefix cache).
    """

    rank: int
    alpha: float
    use_rslora: bool
    rank_pattern: dict[str, int]
    alpha_pattern: dict[str, float]
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]
    digest: str

    def rank_and_alpha(self, module: str) -> tuple[int, float]:
        """``(r, lora_alpha)`` for one module, after the patterns."""
        return _lookup(self.rank_pattern, module, self.rank), _lookup(self.alpha_pattern, module, self.alpha)


def read_peft_lora(folder: str | Path) -> PeftLora:
    """Read and check one PEFT LoRA folder.

    Raises:
        AdapterError: a missing file, an unsupported feature or a malformed tensor name, named.
    """
    folder = Path(folder)
    config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    for path in (config_path, weights_path):
        if not path.is_file():
            raise AdapterError(f"{path}: missing (a PEFT LoRA folder holds {CONFIG_FILE} and {WEIGHTS_FILE})")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as error:
        raise AdapterError(f"{config_path}: not valid JSON ({error})") from None
    _check_config(config, config_path)
    digest = hashlib.sha256(config_path.read_bytes() + weights_path.read_bytes()).hexdigest()[:16]
    tensors = load_file(str(weights_path))
    halves: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        if match is None:
            raise AdapterError(
                f"{weights_path}: tensor {key!r} is not a LoRA weight "
                "(expected base_model.model.<module>.lora_A.weight / lora_B.weight)"
            )
        if tensor.dim() != 2:
            raise AdapterError(f"{weights_path}: tensor {key!r} has shape {list(tensor.shape)}, expected 2-D")
        halves.setdefault(match.group(1), {})[match.group(2)] = tensor
    pairs = {}
    for module, half in halves.items():
        for side in "AB":
            if side not in half:
                raise AdapterError(f"{weights_path}: base_model.model.{module}.lora_{side}.weight is missing")
        pairs[module] = (half["A"], half["B"])
    if not pairs:
        raise AdapterError(f"{weights_path}: holds no LoRA weights")
    return PeftLora(
        rank=int(config["r"]),
        alpha=float(config.get("lora_alpha", config["r"])),
        use_rslora=bool(config.get("use_rslora", False)),
        rank_pattern=dict(config.get("rank_pattern") or {}),
        alpha_pattern=dict(config.get("alpha_pattern") or {}),
        pairs=pairs,
        digest=digest,
    )


def _check_config(config: dict, path: Path) -> None:
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{path}: peft_type {config.get('peft_type')!r} is not supported (LORA)")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise AdapterError(f"{path}: r must be a positive integer, got {rank!r}")
    refused = {
        "modules_to_save": "fully trained copies of modules are not supported, only LoRA pairs",
        "use_dora": "DoRA is not supported",
        "layers_to_transform": "layer selection by index is not supported (name the modules instead)",
        "layer_replication": "layer replication is not supported",
        "target_parameters": "LoRA on raw parameters is not supported (adapt per-expert modules)",
    }
    for field, why in refused.items():
        if config.get(field):
            raise AdapterError(f"{path}: {field} is set: {why}")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"{path}: bias {config['bias']!r} is not supported (none)")
    if config.get("lora_bias"):
        raise AdapterError(f"{path}: lora_bias is not supported")


def _lookup(pattern: dict, module: str, default):
    for key, value in pattern.items():
        if module == key or module.endswith("." + key) or re.fullmatch(key, module):
            return value
    return default
