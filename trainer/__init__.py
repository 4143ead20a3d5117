"""The trainer forward: served log-probs recomputed bitwise, with autograd (``docs/trainer.md``)."""

from .trainer_forward import TrajectoryLogprobs, make_trainable, trajectory_logprobs
from .training_cache import TrainingCache
from .trajectory import PackedBatch, Trajectory

__all__ = [
    "PackedBatch",
    "TrainingCache",
    "Trajectory",
    "TrajectoryLogprobs",
    "make_trainable",
    "trajectory_logprobs",
]
