"""A complete random checkpoint folder: tokenizer, config (with its special token ids) and weights."""

import json
from pathlib import Path
from typing import Any

from common.tokenizer import Tokenizer, write_tiny_tokenizer
from services.engine.model.config import ModelConfig

from .presets import preset_config
from .random_init import write_random_checkpoint


def init_checkpoint(
    out_dir: Path,
    family: str,
    preset: str = "tiny",
    seed: int = 0,
    layout: str = "hub",
    overrides: dict[str, Any] | None = None,
) -> ModelConfig:
    """Write ``out_dir`` as a loadable Hugging Face folder with random weights.

    The tokenizer is written first so that ``bos_token_id``, ``eos_token_id`` and ``pad_token_id``
    in ``config.json`` name its real special tokens.

    Args:
        out_dir: created if missing.
        family: ``k3``, ``kimi_linear`` or ``deepseek_v32``.
        preset: size preset.
        seed: weight seed.
        layout: ``hub`` or ``transformers`` tensor layout.
        overrides: config keys replacing the preset's.
    """
    config = preset_config(family, preset)
    config.update(overrides or {})
    out_dir.mkdir(parents=True, exist_ok=True)
    write_tiny_tokenizer(out_dir, family, config["vocab_size"])
    tokenizer = Tokenizer.from_pretrained(out_dir)
    pad_token = json.loads((out_dir / "tokenizer_config.json").read_text()).get("pad_token")
    config["bos_token_id"] = tokenizer.bos_token_id
    config["eos_token_id"] = tokenizer.eos_token_ids
    config["pad_token_id"] = tokenizer.token_to_id(pad_token) if pad_token else None
    return write_random_checkpoint(out_dir, config, seed=seed, layout=layout)
