"""A migrated request: prompt + the tokens it already generated, prefilled again, continues exactly
where it stopped, seeded sampling included (its draws are keyed by position, and positions go on)."""

import numpy as np
import pytest

from common.sampling_params import SamplingParams
from services.engine.engine_config import EngineConfig
from services.engine.engine_core import EngineCore
from tests.conftest import TEST_DEVICE

PROMPT = [(7 * i) % 89 + 3 for i in range(21)]


def bits(values):
    return np.asarray(values, dtype=np.float32).view(np.int32).tolist()


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    # Batch-invariant: a token computed in a prefill chunk has the same bits as one decoded alone.
    config = EngineConfig(
        model=str(tiny_checkpoint("k3")), device=TEST_DEVICE, dtype="float32", batch_invariant=True
    )
    return EngineCore(config)


def run(engine, prompt, params, request_id, resumed_tokens=0):
    request = engine.add_request(prompt, params, request_id, resumed_tokens=resumed_tokens)
    while engine.has_unfinished:
        engine.step()
    return request


def test_a_seeded_request_resumed_after_k_tokens_draws_the_same_rest(engine):
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=1234, logprobs=2, ignore_eos=True)
    whole = run(engine, PROMPT, params, "whole")
    k = 5
    rest = SamplingParams(max_tokens=12 - k, temperature=1.0, seed=1234, logprobs=2, ignore_eos=True)
    resumed = run(engine, PROMPT + whole.output_ids[:k], rest, "resumed", resumed_tokens=k)
    assert resumed.output_ids == whole.output_ids[k:]
    assert bits(resumed.logprobs) == bits(whole.logprobs[k:])
    assert resumed.top_logprobs == whole.top_logprobs[k:]
    # Without the offset the draws restart at position 0: a different sample (the offset did the work).
    restarted = run(engine, PROMPT + whole.output_ids[:k], rest, "restarted")
    assert restarted.output_ids != whole.output_ids[k:]


@pytest.mark.parametrize("resumed_tokens", [-1, len(PROMPT)], ids=["negative", "whole-prompt"])
def test_resumed_tokens_must_leave_part_of_the_prompt(engine, resumed_tokens):
    with pytest.raises(ValueError, match="resumed_tokens"):
        engine.add_request(PROMPT, SamplingParams(), "bad", resumed_tokens=resumed_tokens)
