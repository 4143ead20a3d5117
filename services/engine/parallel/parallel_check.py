"""``check_parallel``: whether an engine's parallel degrees can run, from ``config.json`` alone.

Runs before any rank starts or any weight is read, so a bad layout costs nothing: degrees that do not
divide the model's heads or experts (``ParallelLayout.validate``), more ranks than CUDA devices,
features that are single-rank for now. Every error names the flag.
"""

import torch

from services.engine.engine_config import EngineConfig
from services.engine.model.config_loader import load_model_config


def check_parallel(config: EngineConfig, prebuilt: bool = False) -> None:
    """Raise ``ValueError`` naming the flag if ``config``'s layout cannot run here; no-op on one rank.

    Args:
        config: the engine's config (its ``model`` folder's ``config.json`` is read, nothing else).
        prebuilt: the engine was handed an already built model (one rank's whole model).
    """
    if config.world_size == 1:
        return
    if prebuilt:
        raise ValueError(
            f"--tp {config.tp}: a prebuilt model is one rank's whole model; load the checkpoint folder"
        )
    if config.adapters:
        raise ValueError("--adapters: LoRA adapters on a parallel engine are not supported yet")
    config.layout.validate(load_model_config(config.model), config.batch_invariant)
    kind, _, index = config.device.partition(":")
    if kind == "cuda":
        base, visible = int(index or 0), torch.cuda.device_count()
        if base + config.world_size > visible:
            raise ValueError(
                f"--tp x --dcp x --pcp x --pp: {config.world_size} ranks need CUDA devices {base}.."
                f"{base + config.world_size - 1} (one each), and {visible} are visible"
            )
