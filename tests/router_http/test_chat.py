"""``/v1/chat/completions`` over a real cluster: the router renders the template, streaming equals
non-streaming, the first chunk carries the role, logprobs in the chat format."""

import pytest

from common.tokenizer import Tokenizer
from common.tokenizer.token_bytes import TokenBytes
from proto.baton.v1 import generation_pb2
from tests.router_http.client import post, stream

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "Baton"}]},
]
BODY = {"messages": MESSAGES, "max_completion_tokens": 6, "temperature": 0, "ignore_eos": True}


def test_chat_completion_equals_the_grpc_chat_and_its_stream(cluster):
    whole = post(cluster.port, "/v1/chat/completions", {**BODY, "return_token_ids": True}).body
    [choice] = whole["choices"]
    assert whole["object"] == "chat.completion" and whole["id"].startswith("chatcmpl-")
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
    chat = generation_pb2.Chat(
        messages=[
            generation_pb2.ChatMessage(role="system", content="Be brief."),
            generation_pb2.ChatMessage(role="user", content="Hello\nBaton"),
        ],
        add_generation_prompt=True,
    )
    grpc_messages = list(
        cluster.stub.Generate(
            generation_pb2.GenerateRequest(
                chat=chat,
                sampling=generation_pb2.SamplingParameters(max_tokens=6, temperature=0, ignore_eos=True),
            ),
            timeout=60,
        )
    )
    assert choice["token_ids"] == [t for m in grpc_messages for t in m.token_ids]
    assert choice["message"]["content"] == "".join(m.text for m in grpc_messages)
    prompt_ids = cluster.stub.Tokenize(generation_pb2.TokenizeRequest(chat=chat), timeout=10).token_ids
    assert whole["usage"]["prompt_tokens"] == len(prompt_ids) and whole["usage"]["completion_tokens"] == 6

    streamed = stream(
        cluster.port, "/v1/chat/completions", {**BODY, "stream_options": {"include_usage": True}}
    )
    assert streamed.status == 200 and streamed.events[-1] == "[DONE]"
    *chunks, usage_chunk = streamed.chunks()
    assert all(c["object"] == "chat.completion.chunk" for c in chunks + [usage_chunk])
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0]["role"] == "assistant" and all("role" not in d for d in deltas[1:])
    assert "".join(d.get("content", "") for d in deltas) == choice["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert usage_chunk["choices"] == [] and _counts(usage_chunk["usage"]) == _counts(whole["usage"])


def test_max_tokens_is_accepted_as_the_older_name(cluster):
    body = {"messages": MESSAGES, "max_tokens": 3, "ignore_eos": True}
    reply = post(cluster.port, "/v1/chat/completions", body)
    assert reply.status == 200 and reply.body["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_chat_logprobs_shapes(cluster, streamed):
    body = {**BODY, "max_completion_tokens": 4, "logprobs": True, "top_logprobs": 3, "return_token_ids": True}
    if streamed:
        choices = [c["choices"][0] for c in stream(cluster.port, "/v1/chat/completions", body).chunks()]
        ids = [t for c in choices for t in c["token_ids"]]
        content = [entry for c in choices for entry in c["logprobs"]["content"]]
    else:
        choice = post(cluster.port, "/v1/chat/completions", body).body["choices"][0]
        ids, content = choice["token_ids"], choice["logprobs"]["content"]
    pieces = TokenBytes(Tokenizer.from_pretrained(cluster.model))
    # A token's text and bytes; an id of the model's vocabulary beyond the tokenizer's has neither.
    assert [e["token"] for e in content] == [pieces.text(t) or f"token_id:{t}" for t in ids] and len(ids) == 4
    assert [e["bytes"] for e in content] == [
        None if pieces.piece(t) is None else list(pieces.piece(t)) for t in ids
    ]
    for entry in content:
        assert sorted(entry) == ["bytes", "logprob", "token", "top_logprobs"]
        for top in entry["top_logprobs"]:
            assert top["bytes"] is None or bytes(top["bytes"]).decode("utf-8", "replace") == top["token"]
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 3
        values = [t["logprob"] for t in entry["top_logprobs"]]
        assert values == sorted(values, reverse=True)
        assert entry["top_logprobs"][0]["token"] == entry["token"]  # greedy picks the most likely token
        assert entry["top_logprobs"][0]["logprob"] == pytest.approx(entry["logprob"])


def test_chat_without_logprobs_has_none(cluster):
    choice = post(cluster.port, "/v1/chat/completions", {**BODY, "max_completion_tokens": 2}).body["choices"][
        0
    ]
    assert choice["logprobs"] is None and "token_ids" not in choice


def _counts(usage: dict) -> tuple[int, int, int]:
    """Usage without cached tokens, which depend on what earlier tests left in the prefix cache."""
    return usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]
