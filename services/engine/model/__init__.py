"""The model: validated configs and the KDA / MLA (+ DSA) / MoE decoder for the three families.

``load_model_config(dir)`` validates ``config.json`` before anything else; ``CausalLM(config)`` is the
network; ``services.engine.checkpoint.loader.load_model(dir)`` does both and streams the weights in.
"""

from common.config_fields import ConfigError

from .causal_lm import CausalLM
from .config import ModelConfig
from .config_loader import load_model_config
from .layer_cache import KdaLayerCache, MlaLayerCache, ModelCache
from .step_metadata import SequenceStep, StepMetadata, build_step_metadata

__all__ = [
    "CausalLM",
    "ConfigError",
    "KdaLayerCache",
    "MlaLayerCache",
    "ModelCache",
    "ModelConfig",
    "SequenceStep",
    "StepMetadata",
    "build_step_metadata",
    "load_model_config",
]
