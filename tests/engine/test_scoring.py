"""Scoring with the top-n alternatives (``scoring.score_ranked``, ``EngineService.score_prompt``): each
position's token log-prob and alternatives against a plain float32 ``log_softmax`` of the model's
full-sequence logits, the token's bits those of ``LLM.score``, the alternatives' bits those of the row the
token came from."""

import pytest
import torch

from services.engine import LLM
from services.engine.engine_config import EngineConfig
from services.engine.engine_core import EngineCore
from services.engine.engine_service import EngineService
from services.engine.scoring import ScoreItem, score_ranked
from tests.conftest import TEST_DEVICE
from tests.relative_error import relative_error

PROMPTS = [[3, 17, 99, 5, 42, 42, 7, 250, 11, 64, 9], [8, 1], [120]]


@pytest.fixture(scope="module")
def llm(tiny_checkpoint):
    return LLM(str(tiny_checkpoint("kimi_linear")), dtype="float32", device=TEST_DEVICE)


def reference_rows(model, prompt: list[int]) -> torch.Tensor:
    """``[L - 1, V]``: row ``k`` the float32 log-softmax of the logits that predict ``prompt[k + 1]``."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt], device=model.device))[0, :-1]
    return torch.log_softmax(logits.float(), dim=-1)


@pytest.mark.parametrize("top_n", [0, 1, 5], ids=lambda n: f"top{n}")
def test_score_ranked_matches_a_plain_log_softmax_of_the_model_logits(llm, top_n):
    engine = llm.engine
    items = [ScoreItem(tuple(p[:1]), tuple(p[1:])) for p in PROMPTS]
    ranked = score_ranked(engine.model, items, engine.adapters.table, 4096, top_n)
    plain = llm.score([p[:1] for p in PROMPTS], [p[1:] for p in PROMPTS])
    for prompt, scored, scores in zip(PROMPTS, ranked, plain, strict=True):
        assert len(scored) == len(prompt) - 1
        # the tokens' bits are those LLM.score returns (the same rows, the same float32 log-softmax)
        assert [t.logprob for t in scored] == scores
        if len(prompt) == 1:
            continue
        rows = reference_rows(engine.model, prompt)
        expected = rows[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
        assert relative_error(torch.tensor([t.logprob for t in scored]), expected) < 1e-5
        for k, token in enumerate(scored):
            assert len(token.top_logprobs) == top_n
            if not top_n:
                continue
            values, ids = torch.topk(rows[k], top_n)
            assert [i for i, _ in token.top_logprobs] == ids.tolist()
            assert relative_error(torch.tensor([v for _, v in token.top_logprobs]), values) < 1e-5
            # an alternative that is the scored token itself has the token's own bits
            own = dict(token.top_logprobs).get(prompt[k + 1])
            assert own is None or own == token.logprob


def test_engine_service_scores_a_prompt_on_its_loop_and_holds_nothing(tiny_checkpoint, llm):
    config = EngineConfig(model=str(tiny_checkpoint("kimi_linear")), device=TEST_DEVICE, dtype="float32")
    service = EngineService(EngineCore(config))
    try:
        prompt = PROMPTS[0]
        scored = service.score_prompt(prompt, 2)
        assert [t.logprob for t in scored] == llm.score([prompt[:1]], [prompt[1:]])[0]
        assert all(len(t.top_logprobs) == 2 for t in scored)
        assert service.score_prompt(prompt[:1], 2) == []  # one token: nothing before it to score
        with pytest.raises(ValueError, match="top_logprobs: must be between 0 and 20"):
            service.score_prompt(prompt, 21)
        with pytest.raises(ValueError, match="prompt_ids: needs at least one token"):
            service.score_prompt([], 0)
        with pytest.raises(ValueError, match="adapter"):
            service.score_prompt(prompt, 0, adapter="nope")
        state = service.integrity()
        assert state.ok and (state.used_blocks, state.used_slots, state.request_ids) == (0, 0, ())
    finally:
        service.close()
