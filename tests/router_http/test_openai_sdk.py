"""The official ``openai`` SDK against the OpenAI front of a real cluster, every sampling control of
issue 20 in one request, streamed and not: a batch of prompts with ``n`` samples, a seed, stop strings,
``logit_bias``, the presence / frequency / repetition penalties, log-probs named by their text; a chat
with content parts, ``max_completion_tokens``, top log-probs and a ``json_schema`` response format. The
streamed reply, put together, is the whole one (seeded samples), and the bias and the schema show in
the output."""

import json

import openai
import pytest

from common.tokenizer import Tokenizer

SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def client(cluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{cluster.port}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def favourite(cluster) -> int:
    """An ordinary token id of the cluster's tokenizer for ``logit_bias`` to push."""
    tokenizer = Tokenizer.from_pretrained(cluster.model)
    return tokenizer.encode(" the")[-1]


def _completion_args(cluster, favourite: int) -> dict:
    return dict(
        model=cluster.model.name,
        prompt=["Hello Baton", "The cache"],
        n=2,
        max_tokens=8,
        temperature=0.9,
        top_p=0.95,
        seed=21,
        stop=["\n\n\n"],
        logprobs=2,
        logit_bias={str(favourite): 6.0},
        presence_penalty=0.4,
        frequency_penalty=0.3,
        extra_body={"repetition_penalty": 1.2, "ignore_eos": True, "return_token_ids": True},
    )


def test_completions_with_every_control_whole_and_streamed(client, cluster, favourite):
    args = _completion_args(cluster, favourite)
    whole = client.completions.create(**args)
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    assert whole.usage.completion_tokens == 4 * 8
    ids = [c.model_extra["token_ids"] for c in whole.choices]
    assert sum(t == favourite for row in ids for t in row) >= 3  # the bias shows (chance: 32 / 643)
    for choice in whole.choices:
        tokens = (
            choice.logprobs.tokens
        )  # named by their text (the tiny model's ids past its tokenizer: by id)
        assert len(tokens) == 8 and all(
            len(top) <= 3 for top in choice.logprobs.top_logprobs
        )  # top 2 + sampled
        if not any(t.startswith("token_id:") for t in tokens):
            assert "".join(tokens) == choice.text
    assert ids[0] != ids[1]  # the two samples of a prompt: seeds 21 and 22
    streamed = client.completions.create(**args, stream=True, stream_options={"include_usage": True})
    texts, usage = ["", "", "", ""], None
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
        usage = chunk.usage or usage
    assert texts == [c.text for c in whole.choices]
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat_with_every_control_and_a_json_schema_whole_and_streamed(client, cluster, favourite):
    args = dict(
        model=cluster.model.name,
        messages=[
            {"role": "system", "content": "Answer in JSON."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Is the cache "}, {"type": "text", "text": "warm?"}],
            },
        ],
        n=2,
        max_completion_tokens=40,
        temperature=0.8,
        seed=5,
        logprobs=True,
        top_logprobs=2,
        logit_bias={str(favourite): -100.0},
        presence_penalty=0.5,
        frequency_penalty=0.5,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True},
        },
    )
    whole = client.chat.completions.create(**args)
    assert [c.index for c in whole.choices] == [0, 1]
    for choice in whole.choices:
        answer = json.loads(choice.message.content)
        assert set(answer) == {"ok", "n"} and isinstance(answer["ok"], bool) and answer["n"] in (1, 2, 3)
        assert choice.finish_reason == "stop"
        assert all(len(entry.top_logprobs) == 2 for entry in choice.logprobs.content)
        assert "".join(entry.token for entry in choice.logprobs.content) == choice.message.content
    streamed = client.chat.completions.create(**args, stream=True)
    contents = ["", ""]
    for chunk in streamed:
        for choice in chunk.choices:
            contents[choice.index] += choice.delta.content or ""
    assert contents == [c.message.content for c in whole.choices]


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": 5}}}},
            None,
        ),
        ({"n": 100}, "n"),
    ],
)
def test_the_sdk_gets_400s_naming_the_field(client, cluster, extra, param):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=cluster.model.name, messages=[{"role": "user", "content": "x"}], max_tokens=2, **extra
        )
    where = refused.value.body["param"]
    assert where == param if param else where.startswith("response_format")
