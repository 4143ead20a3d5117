"""Decode steps with processed rows (logit bias and penalties, a grammar's mask) replay their CUDA graph on
the device machine (skipped without CUDA): every request's tokens and log-probs equal the engine's
without graphs, bit for bit, and the graph ran for those steps. The CPU side, with the eager capture
stand-in, is ``tests/engine/test_processed_rows_graphs.py``."""

import pytest
import torch

from services.engine import LLM
from tests.engine.test_processed_rows_graphs import PARAMS, PROMPTS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
ENGINE = {"device": "cuda:0", "dtype": "float32", "kernels": "triton", "block_size": 16, "max_num_seqs": 4}


def test_processed_rows_replay_the_graph_with_the_eager_bits(tiny_checkpoint):
    model = str(tiny_checkpoint("k3"))
    eager = LLM(model, cuda_graphs=False, **ENGINE).generate(PROMPTS, PARAMS)
    llm = LLM(model, cuda_graphs=True, **ENGINE)
    got = llm.generate(PROMPTS, PARAMS)
    assert llm.engine.runner.graphs.replays >= 10, (
        "the decode steps with processed rows did not replay the graph"
    )
    for g, e in zip(got, eager, strict=True):
        assert g.token_ids == e.token_ids
        assert g.logprobs == e.logprobs and g.top_logprobs == e.top_logprobs
    llm.engine.check_integrity()
