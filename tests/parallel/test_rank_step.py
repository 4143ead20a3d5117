"""The broadcast step is all a follower needs: replaying rank 0's ``RankStep``s (state copies, then the
forward) on a second set of pools leaves them bitwise equal to rank 0's, through chunked prefills,
decodes and prefix-cache hits that restore KDA snapshots. In-process, one model: the pools, not the
shards, are under test."""

import torch

from services.engine import LLM, SamplingParams
from services.engine.cache_manager import CacheManager
from services.engine.model_runner import ModelRunner
from services.engine.parallel.rank_step import RESTORE, SAVE, RankStep

PREFIX = [(3 * i + 1) % 97 for i in range(33)]


class StepRecorder:
    """Stands in for the rank group: keeps every step rank 0 would broadcast."""

    def __init__(self):
        self.steps: list[RankStep] = []

    def send(self, step: RankStep) -> None:
        self.steps.append(step)


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.uint8)


def test_replayed_steps_leave_a_followers_pools_equal_to_rank_0s(tiny_checkpoint):
    llm = LLM(str(tiny_checkpoint("k3")), dtype="float32", max_num_batched_tokens=20, max_model_len=48)
    engine = llm.engine
    recorder = StepRecorder()
    engine.runner.ranks = recorder
    engine.cache.record_state_copies()
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    for tail in ([5], [8]):  # the second prompt restores the first one's snapshots
        llm.generate([PREFIX + tail], params)
    kinds = {copy.kind for step in recorder.steps for copy in step.state_copies}
    assert kinds == {SAVE, RESTORE}, "the scenario must save and restore snapshots"

    follower = CacheManager.for_model(engine.config, engine.model)
    runner = ModelRunner(engine.model, follower)
    for step in recorder.steps:
        follower.apply_state_copies(step.state_copies)
        runner.forward(list(step.steps), list(step.logit_rows))
    follower.apply_state_copies(engine.cache.take_state_copies())  # the copies after the last step
    for name, mine, theirs in (
        ("blocks", follower.blocks.storage, engine.cache.blocks.storage),
        ("slots", follower.slots.storage, engine.cache.slots.storage),
        ("snapshots", follower.snapshots.pool.storage, engine.cache.snapshots.pool.storage),
    ):
        assert torch.equal(_bits(mine), _bits(theirs)), name
