"""``RankShard``: what a follower rank holds (its shard of the model and of the cache pools) and how it
runs one broadcast step."""

import dataclasses

import torch

from services.engine.cache_manager import CacheManager
from services.engine.engine_config import EngineConfig
from services.engine.engine_core import load_engine_model
from services.engine.model_runner import ModelRunner

from .context import ParallelContext
from .rank_step import RankStep


class RankShard:
    """A follower's model shard, cache pools and runner, built as rank 0 builds its own.

    Args:
        config: the engine's config (rank 0's, so the pools have the same blocks and slots).
        context: this rank's place in the layout.
        device: this rank's device (``rank_group.rank_device``).
    """

    def __init__(self, config: EngineConfig, context: ParallelContext, device: str):
        config = dataclasses.replace(config, device=device)
        self.model = load_engine_model(config, context)
        self.cache = CacheManager.for_model(config, self.model)
        self.runner = ModelRunner(self.model, self.cache)

    @torch.no_grad()
    def run(self, step: RankStep) -> None:
        """Apply the step's KDA state copies, then run its forward (the logits are rank 0's to use)."""
        self.cache.apply_state_copies(step.state_copies)
        self.runner.forward(list(step.steps), list(step.logit_rows))
