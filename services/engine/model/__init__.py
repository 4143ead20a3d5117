"""The model: validated configs and the KDA / MLA (+ DSA) / MoE decoder for the three families.

``load_model_config(dir)`` validates ``config.json`` before anything else; ``CausalLM(config)`` is the
network; ``services.engine.checkpoint.loader.load_model(dir)`` does both and streams the weights in.
"""

from .causal_lm import CausalLM
from .config import ModelConfig
from .config_fields import ConfigError
from .config_loader import load_model_config
from .forward_batch import ForwardBatch, ModelCache, SequenceSlice
from .state import ContiguousCache

__all__ = [
    "CausalLM",
    "ConfigError",
    "ContiguousCache",
    "ForwardBatch",
    "ModelCache",
    "ModelConfig",
    "SequenceSlice",
    "load_model_config",
]
