"""``RankShard``: what a follower rank holds (its shard of the model and of the cache pools, and its
transfer agent once rank 0 opens it) and how it runs one broadcast step or answers a handoff message."""

import dataclasses

import torch

from services.engine.cache_manager import CacheManager
from services.engine.engine_config import EngineConfig
from services.engine.engine_core import load_engine_model
from services.engine.model_runner import ModelRunner
from services.transfer import BLOCKS, STATE

from .context import ParallelContext
from .rank_handoff import HandoffCommand, LandedCheck, RankSent, RankTransfer, TransferSetup, landed_checksum
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
        self.transfer: RankTransfer | None = None  # opened by rank 0's TransferSetup

    @torch.no_grad()
    def run(self, step: RankStep) -> None:
        """Apply the step's KDA state copies, then run its forward (the logits are rank 0's to use)."""
        self.cache.apply_state_copies(step.state_copies)
        self.runner.forward(list(step.steps), list(step.logit_rows))

    def answer(self, message: TransferSetup | HandoffCommand | LandedCheck, rank: int) -> object:
        """A handoff message's answer for rank 0: a ``TransferSetup`` opens this rank's agent (its
        ``TransferEndpoint``, or the error as a string); a ``HandoffCommand`` sends this rank's part
        (a ``RankSent``); a ``LandedCheck`` hashes what a handoff filled here (the int, or the error)."""
        if isinstance(message, LandedCheck):
            storages = {BLOCKS: self.cache.blocks.storage, STATE: self.cache.slots.storage}
            try:
                return landed_checksum(self.model.config, storages, message, rank)
            except Exception as error:  # noqa: BLE001 (answered, as above)
                return f"rank {rank}: {type(error).__name__}: {error}"
        if isinstance(message, TransferSetup):
            try:
                self.transfer = RankTransfer.open_follower(message, rank, self.model.config, self.cache)
                return self.transfer.backend.endpoint()
            except Exception as error:  # noqa: BLE001 (answered: rank 0 raises it, the group stays in step)
                return f"rank {rank}: {type(error).__name__}: {error}"
        if self.transfer is None:
            return RankSent(rank, 0, 0.0, "TransferError: this rank has no transfer agent")
        return self.transfer.send(rank, message)

    def close(self) -> None:
        if self.transfer is not None:
            self.transfer.close()
