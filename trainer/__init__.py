"""The trainer forward: served log-probs recomputed bitwise, with autograd (``docs/trainer.md``)."""

from .logprob_dump import read_trajectories, trainer_records, write_trainer_dump
from .lora_training import save_adapter, trainable_adapter
from .trainer_forward import TrajectoryLogprobs, make_trainable, trajectory_logprobs
from .training_cache import TrainingCache
from .trajectory import PackedBatch, Trajectory

__all__ = [
    "PackedBatch",
    "TrainingCache",
    "Trajectory",
    "TrajectoryLogprobs",
    "make_trainable",
    "read_trajectories",
    "save_adapter",
    "trainable_adapter",
    "trainer_records",
    "trajectory_logprobs",
    "write_trainer_dump",
]
