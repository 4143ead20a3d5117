"""``/v1/models``, ``/health`` and ``/v1/completions`` over a real cluster: greedy output equals the
gRPC API and the offline engine, streaming equals non-streaming, SSE framing, logprobs, usage."""

import pytest

from common.tokenizer import Tokenizer
from common.tokenizer.token_bytes import TokenBytes
from proto.baton.v1 import generation_pb2
from services.engine import LLM, SamplingParams
from tests.router_http.client import get, post, stream

PROMPT = list(range(40, 90))


def test_models_lists_the_served_model(cluster):
    reply = get(cluster.port, "/v1/models")
    assert reply.status == 200 and reply.body["object"] == "list"
    [card] = reply.body["data"]
    assert card["id"] == cluster.model.name and card["object"] == "model"
    assert card["owned_by"] == "baton" and card["max_model_len"] == 4096
    assert isinstance(card["created"], int)
    assert get(cluster.port, f"/v1/models/{cluster.model.name}").body == card
    missing = get(cluster.port, "/v1/models/other")
    assert missing.status == 404 and missing.body["error"]["code"] == "model_not_found"


def test_health_is_ok_while_the_router_answers(cluster):
    reply = get(cluster.port, "/health")
    assert (reply.status, reply.body) == (200, {"status": "ok"})


def test_greedy_token_ids_equal_the_grpc_api_and_the_offline_engine(cluster):
    body = {"prompt": PROMPT, "max_tokens": 5, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    reply = post(cluster.port, "/v1/completions", body)
    assert reply.status == 200, reply.body
    [choice] = reply.body["choices"]
    grpc_messages = list(
        cluster.stub.Generate(
            generation_pb2.GenerateRequest(
                token_ids=generation_pb2.TokenIds(ids=PROMPT),
                sampling=generation_pb2.SamplingParameters(max_tokens=5, temperature=0, ignore_eos=True),
            ),
            timeout=60,
        )
    )
    offline = LLM(str(cluster.model), dtype="float32").generate(
        [PROMPT], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    )[0]
    assert choice["token_ids"] == [t for m in grpc_messages for t in m.token_ids] == offline.token_ids
    assert choice["prompt_token_ids"] == PROMPT
    assert choice["text"] == "".join(m.text for m in grpc_messages)
    assert choice["finish_reason"] == "length" and choice["logprobs"] is None
    assert reply.body["object"] == "text_completion" and reply.body["id"].startswith("cmpl-")
    assert reply.body["model"] == cluster.model.name
    usage = reply.body["usage"]
    assert usage["prompt_tokens"] == len(PROMPT) and usage["completion_tokens"] == 5
    assert usage["total_tokens"] == len(PROMPT) + 5
    assert isinstance(usage["prompt_tokens_details"]["cached_tokens"], int)


def test_streaming_equals_non_streaming_and_is_framed_as_sse(cluster):
    body = {
        "model": cluster.model.name,
        "prompt": "Hello Baton",
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    whole = post(cluster.port, "/v1/completions", body).body
    streamed = stream(cluster.port, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    assert streamed.status == 200 and streamed.content_type.startswith("text/event-stream")
    assert streamed.events[-1] == "[DONE]" and streamed.events.count("[DONE]") == 1
    *chunks, usage_chunk = streamed.chunks()
    assert len(chunks) >= 2  # one chunk per streamed gRPC message
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    streamed_ids = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert streamed_ids == whole["choices"][0]["token_ids"] and len(streamed_ids) == 8
    assert "prompt_token_ids" not in whole["choices"][0]  # a text prompt's ids are not known here
    assert usage_chunk["choices"] == [] and _counts(usage_chunk["usage"]) == _counts(whole["usage"])
    assert whole["usage"]["completion_tokens"] == 8


def test_streaming_without_include_usage_sends_no_usage_chunk(cluster):
    streamed = stream(
        cluster.port, "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 3, "ignore_eos": True}
    )
    chunks = streamed.chunks()
    assert streamed.events[-1] == "[DONE]" and all(c["choices"] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_legacy_logprobs_shapes(cluster, streamed):
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "ignore_eos": True, "logprobs": 2}
    body["return_token_ids"] = True
    if streamed:
        choices = [c["choices"][0] for c in stream(cluster.port, "/v1/completions", body).chunks()]
        ids = [t for c in choices for t in c["token_ids"]]
        logprobs = {key: [v for c in choices for v in c["logprobs"][key]] for key in choices[0]["logprobs"]}
    else:
        choice = post(cluster.port, "/v1/completions", body).body["choices"][0]
        ids, logprobs = choice["token_ids"], choice["logprobs"]
    assert sorted(logprobs) == ["text_offset", "token_logprobs", "tokens", "top_logprobs"]
    pieces = TokenBytes(Tokenizer.from_pretrained(cluster.model))
    # A token's text; an id of the model's vocabulary beyond the tokenizer's has none: vLLM's id form.
    assert logprobs["tokens"] == [pieces.text(t) or f"token_id:{t}" for t in ids] and len(ids) == 4
    assert all(isinstance(v, float) and v <= 0 for v in logprobs["token_logprobs"])
    for token, value, top in zip(
        logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
    ):
        assert 2 <= len(top) <= 3 and top[token] == pytest.approx(value)
        assert max(top, key=top.get) == token  # greedy picks the most likely token
    assert logprobs["text_offset"] == sorted(logprobs["text_offset"]) and logprobs["text_offset"][0] == 0


def _counts(usage: dict) -> tuple[int, int, int]:
    """Usage without cached tokens, which depend on what earlier tests left in the prefix cache."""
    return usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]
