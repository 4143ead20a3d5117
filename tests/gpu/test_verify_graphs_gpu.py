"""Verify CUDA graphs (``--kda-rollback states``) on the device machine (skipped without CUDA): greedy
speculative decoding whose verify steps replay their graphs gives the tokens of plain decoding (with the
target as its own draft every draft is accepted: the commit of a whole verify), and the same drafts
accepted as the eager verify steps of ``--kda-rollback replay`` (a test of its own: the eager arm's
chunk kernels compile and autotune first). The CPU side (padding, per-token slots,
the runner's choice) is ``tests/engine/test_verify_graphs.py``."""

import pytest
import torch

from common.sampling_params import SamplingParams
from services.engine import LLM
from tests.engine.test_draft_model import draft_overrides

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICE = "cuda:0"
ENGINE = {"block_size": 16, "max_num_seqs": 4, "max_model_len": 256, "dtype": "float32", "kernels": "triton"}
PARAMS = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, logprobs=0)


def _prompts(count: int, length: int = 40) -> list[list[int]]:
    generator = torch.Generator().manual_seed(7)
    return [torch.randint(3, 1024, (length + 5 * i,), generator=generator).tolist() for i in range(count)]


def _speculative(target, draft, rollback: str, prompts):
    """``(tokens per prompt, accepted drafts by position, the engine)`` of greedy speculative decoding."""
    llm = LLM(
        str(target), device=DEVICE, draft_model=str(draft), num_draft_tokens=3, spec_policy="fixed",
        kda_rollback=rollback, **ENGINE,
    )  # fmt: skip
    outputs = [o.token_ids for o in llm.generate(prompts, PARAMS)]
    llm.engine.check_integrity()
    return outputs, llm.engine.spec_counters.counts(), llm.engine


@pytest.mark.parametrize("self_draft", [False, True], ids=["tiny-draft", "self-draft"])
def test_graphed_verify_steps_give_plain_tokens(tiny_checkpoint, self_draft):
    target = tiny_checkpoint("k3")
    draft = target if self_draft else tiny_checkpoint("k3", seed=1, **draft_overrides("k3"))
    prompts = _prompts(3)  # 3 sequences: verify steps padded to the captured size 4
    plain = [o.token_ids for o in LLM(str(target), device=DEVICE, **ENGINE).generate(prompts, PARAMS)]
    outputs, counts, engine = _speculative(target, draft, "states", prompts)
    assert sorted(engine.runner.verify_graphs) == [1, 2, 3]
    assert engine.runner.verify_graphs[3].replays > 0, "no verify step replayed its graph"
    assert outputs == plain, "speculative tokens differ from plain decoding"
    if self_draft:
        assert counts.accepted_by_position == counts.drafted_by_position


def test_graphed_and_eager_verify_accept_the_same_drafts(tiny_checkpoint):
    """``states`` (graphed verify steps) and ``replay`` (eager ones, chunk kernels) accept the same
    drafts at every position and give the same tokens."""
    target = tiny_checkpoint("k3")
    draft = tiny_checkpoint("k3", seed=1, **draft_overrides("k3"))
    prompts = _prompts(3)
    graphed, graphed_counts, _ = _speculative(target, draft, "states", prompts)
    eager, eager_counts, engine = _speculative(target, draft, "replay", prompts)
    assert engine.runner.verify_graphs == {}
    assert eager == graphed
    assert eager_counts.accepted_by_position == graphed_counts.accepted_by_position
