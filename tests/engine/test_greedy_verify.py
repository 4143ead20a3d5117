"""Greedy verification of a step's requests in one sampling call (``acceptance.verify_greedy``) gives
each request exactly what verifying it alone gives: tokens, accepted count, log-probs and top log-probs."""

import torch

from common.sampling_params import SamplingParams
from services.engine.model.backends.sampling import ReferenceSampling
from services.engine.speculative.acceptance import verify, verify_greedy
from services.engine.speculative.proposal import DraftTokens


class CountingSampling(ReferenceSampling):
    """The reference sampler, counting its calls."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def sample(self, logits, params, positions):
        self.calls += 1
        return super().sample(logits, params, positions)


def test_one_call_for_the_batch_and_each_request_as_if_alone():
    generator = torch.Generator().manual_seed(3)
    logits = [torch.randn(k + 1, 50, generator=generator) for k in (3, 1, 4)]
    greedy = [row.argmax(-1).tolist() for row in logits]
    drafts = [  # the first accepted, the second rejected; the only one accepted; the first rejected
        DraftTokens((greedy[0][0], (greedy[0][1] + 7) % 50, greedy[0][2]), None),
        DraftTokens((greedy[1][0],), None),
        DraftTokens(((greedy[2][0] + 1) % 50, *greedy[2][1:4]), None),
    ]
    params = [
        SamplingParams(temperature=0, logprobs=2),
        SamplingParams(temperature=0),
        SamplingParams(temperature=0, logprobs=0),
    ]
    positions = [5, 0, 12]
    sampling = CountingSampling()
    together = verify_greedy(logits, drafts, params, positions, sampling)
    assert sampling.calls == 1
    requests = zip(logits, drafts, params, positions, strict=True)
    alone = [verify(*request, ReferenceSampling()) for request in requests]
    assert together == alone
    assert [v.num_accepted for v in together] == [1, 1, 0]
    assert together[0].top_logprobs is not None and together[1].logprobs is None
