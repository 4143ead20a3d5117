"""``logit_bias`` and the penalties over a real cluster (router -> prefill -> decode): a large bias
forces the token in the prefill's first token and every decoded one; penalised greedy output over
HTTP and gRPC equals the offline engine's (and differs from plain greedy); every bad value is
refused before any worker sees it: HTTP 400 naming the field, gRPC INVALID_ARGUMENT naming it."""

import json
import math

import grpc
import pytest

from proto.baton.v1 import generation_pb2
from services.engine import LLM, SamplingParams
from tests.router_http.client import post, stream
from tests.router_http.conftest import decode_idle

PROMPT = list(range(40, 60))
GREEDY = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True, "return_token_ids": True}


def _vocab(cluster) -> int:
    return json.loads((cluster.model / "config.json").read_text())["vocab_size"]


def _token_ids(reply) -> list[int]:
    assert reply.status == 200, reply.body
    return reply.body["choices"][0]["token_ids"]


def test_a_large_bias_forces_the_token_in_prefill_and_decode(cluster):
    assert _token_ids(post(cluster.port, "/v1/completions", {**GREEDY, "logit_bias": {"7": 100}})) == [7] * 6
    chat = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "logit_bias": {"9": 100.0},
    }
    assert _token_ids(post(cluster.port, "/v1/chat/completions", chat)) == [9] * 3


def test_penalised_greedy_output_equals_the_offline_engine(cluster):
    fields = {"frequency_penalty": 1.5, "presence_penalty": 0.5, "repetition_penalty": 1.25}
    body = {**GREEDY, **fields, "logit_bias": {"5": 2.0}, "logprobs": 0}
    reply = post(cluster.port, "/v1/completions", body)
    http = _token_ids(reply)
    sampling = generation_pb2.SamplingParameters(
        max_tokens=6, temperature=0, ignore_eos=True, logprobs=0, **fields
    )
    sampling.logit_bias[5] = 2.0
    request = generation_pb2.GenerateRequest(token_ids=generation_pb2.TokenIds(ids=PROMPT), sampling=sampling)
    messages = list(cluster.stub.Generate(request, timeout=60))
    with LLM(str(cluster.model), dtype="float32") as llm:
        params = SamplingParams(
            max_tokens=6, temperature=0, ignore_eos=True, logprobs=0, logit_bias={5: 2.0}, **fields
        )
        offline = llm.generate([PROMPT], params)[0]
        plain = llm.generate(
            [PROMPT], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=0)
        )[0]
    assert http == [t for m in messages for t in m.token_ids] == offline.token_ids
    # logprobs are of the processed distribution: the penalties show there even where the greedy
    # tokens stay the same (this model rarely repeats itself)
    served = [v for m in messages for v in m.logprobs]
    assert served == pytest.approx(offline.logprobs, rel=1e-4, abs=1e-5)
    assert reply.body["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx(served, rel=1e-6)
    assert any(abs(a - b) > 1e-3 for a, b in zip(served, plain.logprobs, strict=True))


BAD_HTTP = [
    ({"logit_bias": {"x": 1}}, "logit_bias", "logit_bias: keys must be token ids"),
    ({"logit_bias": {"-1": 1}}, "logit_bias", "logit_bias: keys must be token ids"),
    (
        {"logit_bias": {"5": 101}},
        "logit_bias",
        "logit_bias: the bias of token 5 must be a number in [-100, 100]",
    ),
    ({"logit_bias": {"5": "1"}}, "logit_bias", "logit_bias: the bias of token 5 must be a number"),
    ({"logit_bias": [1, 2]}, "logit_bias", "logit_bias: must be an object"),
    ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias", "logit_bias: 301 entries, more than"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias", "logit_bias: id 99999999 is outside the vocabulary"),
    ({"presence_penalty": 2.5}, "presence_penalty", "presence_penalty: must be a number in [-2.0, 2.0]"),
    ({"frequency_penalty": -3}, "frequency_penalty", "frequency_penalty: must be a number in [-2.0, 2.0]"),
    ({"frequency_penalty": "1"}, "frequency_penalty", "frequency_penalty: must be a number"),
    ({"repetition_penalty": 0}, "repetition_penalty", "repetition_penalty: must be a finite number > 0"),
    ({"repetition_penalty": -1.5}, "repetition_penalty", "repetition_penalty: must be a finite number > 0"),
    ({"repetition_penalty": 1e400}, "repetition_penalty", "repetition_penalty: must be a finite number > 0"),
]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize(
    "fields, param, words", BAD_HTTP, ids=[f"{p}-{i}" for i, (_, p, _) in enumerate(BAD_HTTP)]
)
def test_bad_values_are_400_naming_the_field(cluster, endpoint, fields, param, words):
    if endpoint == "chat":
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], **fields}
    else:
        path, body = "/v1/completions", {"prompt": PROMPT, **fields}
    reply = post(cluster.port, path, body)
    assert reply.status == 400, reply.body
    error = reply.body["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert error["message"].startswith(words), error["message"]
    assert stream(cluster.port, path, body).status == 400


def _bad_grpc(vocab: int):
    def sampling(**fields):
        return generation_pb2.SamplingParameters(max_tokens=2, **fields)

    many = sampling()
    for token in range(301):
        many.logit_bias[token] = 1.0
    return [
        ("out-of-vocab", sampling(logit_bias={vocab: 1.0}), "sampling.logit_bias: id"),
        ("301-entries", many, "sampling.logit_bias: 301 entries, more than the limit of 300"),
        ("bias-101", sampling(logit_bias={5: 101.0}), "sampling.logit_bias: bias of token 5 must be in"),
        ("bias-nan", sampling(logit_bias={5: math.nan}), "sampling.logit_bias: bias of token 5 must be in"),
        (
            "presence",
            sampling(presence_penalty=2.5),
            "sampling.presence_penalty: must be a number in [-2, 2]",
        ),
        ("frequency", sampling(frequency_penalty=-2.5), "sampling.frequency_penalty: must be"),
        ("frequency-nan", sampling(frequency_penalty=math.nan), "sampling.frequency_penalty: must be"),
        ("repetition", sampling(repetition_penalty=-1.0), "sampling.repetition_penalty: must be a finite"),
        ("repetition-inf", sampling(repetition_penalty=math.inf), "sampling.repetition_penalty: must be"),
    ]


def test_bad_values_are_invalid_argument_over_grpc_and_reach_no_worker(cluster):
    for name, sampling, words in _bad_grpc(_vocab(cluster)):
        request = generation_pb2.GenerateRequest(
            token_ids=generation_pb2.TokenIds(ids=PROMPT), sampling=sampling
        )
        with pytest.raises(grpc.RpcError) as caught:
            list(cluster.stub.Generate(request, timeout=30))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
        assert caught.value.details().startswith(words), (name, caught.value.details())
    assert decode_idle(cluster.decode, 10)
