"""Helpers of the trainer tests: bitwise comparison with what an engine served, never vacuous."""

import numpy as np
import torch

from services.engine import LLM
from services.engine.model.invariant_numerics import InvariantNumerics
from services.engine.request import RequestOutput
from trainer import PackedBatch, Trajectory, TrajectoryLogprobs, trajectory_logprobs


def float32_bits(values) -> list[int]:
    """Served logprobs (Python floats holding float32 values) or a float32 tensor, as int32 bit patterns."""
    if isinstance(values, torch.Tensor):
        assert values.dtype == torch.float32
        return values.detach().cpu().view(torch.int32).tolist()
    return np.asarray(values, dtype=np.float32).view(np.int32).tolist()


def assert_served_invariant(llm: LLM) -> None:
    """The engine really served with the batch-invariant numerics and their reference backends."""
    model = llm.engine.model
    assert llm.config.batch_invariant and isinstance(model.numerics, InvariantNumerics)
    assert model.kernels.name == "reference" and model.kernels.sampling.kind == "reference"


def trajectories(outputs: list[RequestOutput]) -> list[Trajectory]:
    return [Trajectory(o.prompt_ids, o.token_ids) for o in outputs]


def assert_bitwise(model, outputs: list[RequestOutput], order: list[int] | None = None) -> int:
    """Recompute ``outputs`` with the trainer (packed in ``order``) and compare every generated token's
    log-prob with the served one as float32 bits. Returns how many tokens were compared (> 0)."""
    order = list(range(len(outputs))) if order is None else order
    packed = PackedBatch.pack([trajectories(outputs)[i] for i in order])
    return assert_same_bits(trajectory_logprobs(model, packed), outputs, order)


def assert_same_bits(result: TrajectoryLogprobs, outputs: list[RequestOutput], order: list[int]) -> int:
    """``result`` (trajectory ``order[slot]`` packed at ``slot``) against the served logprobs, bitwise."""
    compared = 0
    for slot, index in enumerate(order):
        served = outputs[index]
        assert served.logprobs is not None and len(served.logprobs) == len(served.token_ids)
        got = float32_bits(result.of_generated(slot))
        assert got == float32_bits(served.logprobs), f"request {served.request_id} (packed at {slot})"
        compared += len(got)
    assert compared > 0, "VACUOUS: no generated token was compared"
    return compared
