"""``DecodeWorker.Score`` over a real worker process: a prompt's log-probs and top-n alternatives, the
bits ``LLM.score`` gives in this process for the same checkpoint; bad requests refused naming the field;
nothing held afterwards."""

import grpc
import pytest

from proto.baton.v1 import workers_pb2, workers_pb2_grpc
from services.engine import LLM
from tests.services.workers import running_workers

PROMPT = [3, 17, 99, 5, 42, 42, 7, 250, 11, 64, 9, 31, 2]


@pytest.fixture(scope="module")
def decode(tiny_checkpoint):
    model = tiny_checkpoint("kimi_linear")
    with running_workers(model, ("decode", "--dtype", "float32")) as (worker,):
        channel = grpc.insecure_channel(worker.address)
        yield model, workers_pb2_grpc.DecodeWorkerStub(channel)
        channel.close()


def test_score_returns_the_prompt_log_probs_of_llm_score_with_top_n(decode):
    model, stub = decode
    reply = stub.Score(workers_pb2.ScoreRequest(prompt_ids=PROMPT, top_logprobs=3), timeout=60)
    expected = LLM(str(model), dtype="float32").score([PROMPT[:1]], [PROMPT[1:]])[0]
    assert list(reply.logprobs) == expected  # float32 on the wire: the same bits
    assert len(reply.top_logprobs) == len(PROMPT) - 1
    for k, top in enumerate(reply.top_logprobs):
        values = [t.logprob for t in top.top]
        assert len(values) == 3 and values == sorted(values, reverse=True)
        assert values[0] >= reply.logprobs[k]  # nothing beats the most likely token
        own = {t.token_id: t.logprob for t in top.top}.get(PROMPT[k + 1])
        assert own is None or own == reply.logprobs[k]
    plain = stub.Score(workers_pb2.ScoreRequest(prompt_ids=PROMPT), timeout=60)
    assert list(plain.logprobs) == list(reply.logprobs) and not plain.top_logprobs
    assert not stub.Score(workers_pb2.ScoreRequest(prompt_ids=PROMPT[:1]), timeout=60).logprobs
    stats = stub.Stats(workers_pb2.StatsRequest(), timeout=10)
    assert stats.running == 0 and stats.free_blocks == stats.total_blocks


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"prompt_ids": PROMPT, "top_logprobs": 21}, "top_logprobs"),
        ({"prompt_ids": []}, "prompt_ids"),
        ({"prompt_ids": [3, 10**6]}, "prompt_ids: id 1000000 at position 1"),
        ({"prompt_ids": PROMPT, "adapter": "nope"}, "adapter"),
    ],
    ids=["top-over-limit", "empty", "outside-vocabulary", "unknown-adapter"],
)
def test_bad_score_requests_are_refused_naming_the_field(decode, request_fields, field):
    _, stub = decode
    with pytest.raises(grpc.RpcError) as refused:
        stub.Score(workers_pb2.ScoreRequest(**request_fields), timeout=60)
    assert refused.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
    assert field in refused.value.details()
