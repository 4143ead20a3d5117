"""Decode steps with rows whose requests process their logits (logit bias, penalties, a grammar's mask)
still replay their CUDA graph: the graph samples every row from the raw logits and the runner samples
the processed rows again from the graph's logits. On the CPU the capture is the eager stand-in of
``tests/engine/test_verify_graphs.py`` (``EagerCapture``); the tokens and log-probs of every request,
processed or not, equal the engine's without graphs."""

import pytest

from common.sampling_params import SamplingParams
from services.engine import LLM
from tests.engine.constrained_params import REGEX, constrained
from tests.engine.test_verify_graphs import eager_graphs  # noqa: F401 (the fixture)

ENGINE = {
    "dtype": "float32",
    "batch_invariant": True,
    "block_size": 8,
    "max_num_seqs": 4,
    "max_num_batched_tokens": 64,
}
PROMPTS = [list(range(5, 5 + n)) for n in (9, 17, 4)]
PARAMS = [
    SamplingParams(
        temperature=0, max_tokens=12, ignore_eos=True, logprobs=2, presence_penalty=1.5,
        frequency_penalty=0.5, repetition_penalty=1.3, logit_bias={7: 2.5},
    ),
    SamplingParams(temperature=1.0, seed=3, max_tokens=12, ignore_eos=True, logprobs=2),
    constrained("regex", REGEX, seed=5, max_tokens=12, logprobs=2),
]  # fmt: skip


@pytest.fixture(scope="module")
def eager(tiny_checkpoint):
    """The outputs without graphs (computed before ``eager_graphs`` patches the engine)."""
    return LLM(str(tiny_checkpoint("k3")), **ENGINE).generate(PROMPTS, PARAMS)


def test_processed_rows_keep_the_graph_and_the_eager_tokens(tiny_checkpoint, eager, eager_graphs):  # noqa: F811
    llm = LLM(str(tiny_checkpoint("k3")), **ENGINE)
    graphs = llm.engine.runner.graphs
    got = llm.generate(PROMPTS, PARAMS)
    assert graphs.replays >= 10, "the decode steps with processed rows did not replay the graph"
    for g, e in zip(got, eager, strict=True):
        assert g.token_ids == e.token_ids
        assert g.logprobs == e.logprobs and g.top_logprobs == e.top_logprobs
