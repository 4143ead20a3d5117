"""What the router reads of a checkpoint's ``config.json``: the model family and the vocabulary size.

The engine parses and validates the whole file into its ``ModelConfig``
(``services/engine/model/config_loader.py``), reading it and naming its family with the functions here,
so the router and the engine agree on both without the router importing the engine.

Families (DESIGN.md section 2):

- ``kimi_linear``: KDA and NoPE MLA layers, MoE with a shared expert.
- ``deepseek_v32``: MLA with RoPE and a DSA indexer on every layer, MoE.
- ``k3``: a ``kimi_linear`` config with ``index_n_heads``, ``index_head_dim``, ``index_topk``
  (or ``model_type: k3``): Kimi-Linear whose MLA layers carry a DSA indexer (NoPE, like its MLA).
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.config_fields import ConfigError, ConfigReader

FAMILIES = ("kimi_linear", "deepseek_v32", "k3")
STATEFUL_FAMILIES = ("kimi_linear", "k3")  # with KDA layers: a prefix hit ends at a KDA snapshot


@dataclass(frozen=True)
class ModelInfo:
    """The served model as the router needs it.

    Attributes:
        family: one of ``FAMILIES``.
        vocab_size: token ids are in ``[0, vocab_size)``.
    """

    family: str
    vocab_size: int


def read_model_info(source: str | Path | dict[str, Any]) -> ModelInfo:
    """The family and vocabulary size of a checkpoint.

    Args:
        source: a checkpoint folder, a ``config.json`` path, or an already parsed dict.

    Raises:
        FileNotFoundError: the folder has no ``config.json``.
        ConfigError: ``model_type`` is unsupported or ``vocab_size`` missing or not a positive integer.
    """
    reader = ConfigReader(*read_config_json(source))
    return ModelInfo(family=model_family(reader), vocab_size=reader.integer("vocab_size"))


def read_config_json(source: str | Path | dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The raw ``config.json`` object of ``source`` (a folder, a file or a dict) and where it came from.

    Raises:
        FileNotFoundError: the folder has no ``config.json``.
        ConfigError: the file is not a JSON object.
    """
    if isinstance(source, dict):
        return source, "config"
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: not found (expected a Hugging Face checkpoint folder with config.json)"
        )
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError("(file)", f"not valid JSON: {exc}", str(path)) from None
    if not isinstance(raw, dict):
        raise ConfigError("(file)", "must hold a JSON object", str(path))
    return raw, str(path)


def model_family(r: ConfigReader) -> str:
    """The family of a config: its ``model_type``, with a ``kimi_linear`` that has indexer keys a ``k3``.

    Raises:
        ConfigError: ``model_type`` is missing or not one of ``FAMILIES``.
    """
    model_type = r.value("model_type")
    if model_type not in FAMILIES:
        raise r.error("model_type", f"{model_type!r} is not supported (supported: {', '.join(FAMILIES)})")
    if model_type == "deepseek_v32":
        return "deepseek_v32"
    has_index_keys = any(r.has(k) for k in ("index_n_heads", "index_head_dim", "index_topk"))
    return "k3" if model_type == "k3" or has_index_keys else "kimi_linear"
