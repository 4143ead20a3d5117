"""``echo`` with ``logprobs`` on ``/v1/completions`` over a real cluster (lm-evaluation-harness's
loglikelihood call): the log-probs cover the prompt's tokens, then the completion's. The prompt's are
``LLM.score``'s bits for the same prompt (the decode worker's ``Score``), the first token's null; the
completion's are a plain request's; ``text_offset`` indexes the echoed text. Streamed and whole, ``n``
and batches, ``max_tokens`` 0 (the prompt alone), the gRPC fields, and the official ``openai`` SDK."""

import grpc
import openai
import pytest

from common.tokenizer import Tokenizer
from common.tokenizer.token_bytes import TokenBytes
from proto.baton.v1 import generation_pb2
from services.engine import LLM
from tests.router_http.client import post, stream

TEXT = "Hello Baton, the cache"
IDS = [40, 41, 300, 7, 99, 512]
GREEDY = {"max_tokens": 4, "temperature": 0, "ignore_eos": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def tokenizer(cluster) -> Tokenizer:
    return Tokenizer.from_pretrained(cluster.model)


@pytest.fixture(scope="module")
def name(tokenizer):
    pieces = TokenBytes(tokenizer)
    return lambda token_id: pieces.text(token_id) or f"token_id:{token_id}"


@pytest.fixture(scope="module")
def scorer(cluster):
    """``prompt ids -> log-probs of its tokens after the first``, by ``LLM.score`` in this process."""
    llm = LLM(str(cluster.model), dtype="float32")
    return lambda ids: llm.score([ids[:1]], [list(ids[1:])])[0]


def _prompt_ids(cluster, text: str) -> list[int]:
    return list(cluster.stub.Tokenize(generation_pb2.TokenizeRequest(text=text), timeout=30).token_ids)


def _check_prompt_part(
    logprobs: dict, ids: list[int], echo: str, scorer, name, top: int, tokenizer: Tokenizer, text: bool
) -> None:
    """The first ``len(ids)`` entries: the prompt's tokens, scored as ``LLM.score`` scores them, each
    at the length of the decoded tokens before it (a text prompt's BOS has no text in its echo)."""
    count = len(ids)
    assert logprobs["tokens"][:count] == [name(t) for t in ids]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert logprobs["token_logprobs"][1:count] == scorer(ids)  # float32 values, exactly
    for k in range(1, count):
        entry = logprobs["top_logprobs"][k]
        assert name(ids[k]) in entry and len(entry) <= top + 1
        assert max(entry.values()) >= logprobs["token_logprobs"][k]
    offsets = [len(tokenizer.decode(ids[:k], skip_special_tokens=text)) for k in range(count)]
    assert logprobs["text_offset"][:count] == offsets
    assert tokenizer.decode(ids, skip_special_tokens=text) == echo


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_echo_logprobs_cover_the_prompt_then_the_plain_completion(cluster, scorer, name, tokenizer, streamed):
    ids = _prompt_ids(cluster, TEXT)
    plain = post(cluster.port, "/v1/completions", {**GREEDY, "prompt": TEXT, "logprobs": 3})
    plain = plain.body["choices"][0]
    body = {**GREEDY, "prompt": TEXT, "logprobs": 3, "echo": True}
    if streamed:
        chunks = stream(cluster.port, "/v1/completions", body).chunks()
        first = chunks[0]["choices"][0]
        assert first["text"] == TEXT and len(first["logprobs"]["tokens"]) == len(ids)  # the echo chunk
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        logprobs: dict = {}
        for chunk in chunks:
            for choice in chunk["choices"]:
                for key, values in (choice["logprobs"] or {}).items():
                    logprobs.setdefault(key, []).extend(values)
    else:
        choice = post(cluster.port, "/v1/completions", body).body["choices"][0]
        assert choice["token_ids"] == plain["token_ids"]
        text, logprobs = choice["text"], choice["logprobs"]
    assert text == TEXT + plain["text"]
    _check_prompt_part(logprobs, ids, TEXT, scorer, name, 3, tokenizer, True)
    count = len(ids)
    for key in ("tokens", "token_logprobs", "top_logprobs"):
        assert logprobs[key][count:] == plain["logprobs"][key]
    # the completion's offsets index the whole text: the plain ones moved by the echoed prompt
    assert logprobs["text_offset"][count:] == [len(TEXT) + o for o in plain["logprobs"]["text_offset"]]
    every = ids + plain["token_ids"]
    for token_id, token, offset in zip(every, logprobs["tokens"], logprobs["text_offset"], strict=True):
        named = not token.startswith("token_id:") and "\ufffd" not in token  # a text of its own
        if named and token_id not in tokenizer.special_token_ids:
            assert text[offset : offset + len(token)] == token


def test_each_choice_of_n_and_a_batch_echoes_its_own_prompt(cluster, scorer, name, tokenizer):
    other = "Hi there"
    ids = tokenizer.encode("the cache holds blocks")  # ASCII: every token's text is its own
    for prompts, echoes, text in (
        ([TEXT, other], [TEXT, other], True),
        ([ids, ids[:3]], [tokenizer.decode(ids), tokenizer.decode(ids[:3])], False),  # token ids
    ):
        body = {**GREEDY, "prompt": prompts, "n": 2, "logprobs": 1, "echo": True}
        reply = post(cluster.port, "/v1/completions", body)
        assert reply.status == 200, reply.body
        choices = reply.body["choices"]
        assert [c["index"] for c in choices] == [0, 1, 2, 3]
        counts = []
        for index, choice in enumerate(choices):
            prompt, echo = prompts[index // 2], echoes[index // 2]
            prompt_ids = _prompt_ids(cluster, prompt) if text else prompt
            counts.append(len(prompt_ids))
            assert choice["text"].startswith(echo)
            _check_prompt_part(choice["logprobs"], prompt_ids, echo, scorer, name, 1, tokenizer, text)
            assert len(choice["logprobs"]["tokens"]) == len(prompt_ids) + len(choice["token_ids"])
        echo_chunks = {}
        for chunk in stream(cluster.port, "/v1/completions", body).chunks():
            for choice in chunk["choices"]:
                echo_chunks.setdefault(choice["index"], choice)
        for index, (choice, count) in enumerate(zip(choices, counts, strict=True)):
            assert echo_chunks[index]["logprobs"] == {k: v[:count] for k, v in choice["logprobs"].items()}


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_max_tokens_0_with_echo_is_the_prompt_alone(cluster, scorer, name, tokenizer, streamed):
    ids = _prompt_ids(cluster, TEXT)
    body = {"prompt": TEXT, "echo": True, "logprobs": 2, "max_tokens": 0, "temperature": 0}
    if streamed:
        chunks = stream(cluster.port, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
        chunks = chunks.chunks()
        texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
        assert "".join(texts) == TEXT
        assert chunks[0]["choices"][0]["logprobs"]["tokens"] == [name(t) for t in ids]
        finals = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
        assert finals[-1] == "length" and chunks[-1]["usage"]["completion_tokens"] == 0
        return
    reply = post(cluster.port, "/v1/completions", body).body
    choice = reply["choices"][0]
    assert choice["text"] == TEXT and choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["tokens"]) == len(ids)  # the prompt's tokens only
    _check_prompt_part(choice["logprobs"], ids, TEXT, scorer, name, 2, tokenizer, True)
    assert reply["usage"]["completion_tokens"] == 0 and reply["usage"]["prompt_tokens"] == len(ids)


def test_grpc_prompt_logprobs_come_in_the_first_message_and_are_checked(cluster, scorer):
    request = generation_pb2.GenerateRequest(
        token_ids=generation_pb2.TokenIds(ids=IDS),
        sampling=generation_pb2.SamplingParameters(max_tokens=3, ignore_eos=True),
        prompt_logprobs=2,
    )
    messages = list(cluster.stub.Generate(request, timeout=60))
    first = messages[0]
    assert list(first.prompt_token_ids) == IDS
    assert list(first.prompt_logprobs) == scorer(IDS)
    assert [len(t.top) for t in first.prompt_top_logprobs] == [2] * (len(IDS) - 1)
    assert all(not m.prompt_token_ids and not m.prompt_logprobs for m in messages[1:])
    alone = generation_pb2.GenerateRequest(token_ids=request.token_ids)
    plain = list(cluster.stub.Generate(alone, timeout=60))
    assert not plain[0].prompt_token_ids and not plain[0].prompt_logprobs
    request.prompt_logprobs = 21
    with pytest.raises(grpc.RpcError) as refused:
        list(cluster.stub.Generate(request, timeout=60))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith("prompt_logprobs:")


def test_the_openai_sdk_reads_echo_logprobs_as_lm_eval_asks(cluster, scorer, name):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{cluster.port}/v1", api_key="unused", max_retries=0)
    ids = _prompt_ids(cluster, TEXT)
    reply = client.completions.create(
        model=cluster.model.name, prompt=TEXT, echo=True, max_tokens=0, temperature=0.0, logprobs=5
    )
    logprobs = reply.choices[0].logprobs
    assert reply.choices[0].text == TEXT and reply.choices[0].finish_reason == "length"
    assert logprobs.tokens == [name(t) for t in ids]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert logprobs.token_logprobs[1:] == scorer(ids)
    assert all(len(top) >= 5 for top in logprobs.top_logprobs[1:])
    # lm-eval's continuation log-likelihood: the tail of the prompt, summed
    assert sum(logprobs.token_logprobs[-2:]) == pytest.approx(sum(scorer(ids)[-2:]))


def test_the_sdk_takes_prompt_logprobs_and_returns_them_on_the_completion(cluster, scorer):
    from sdk import Client

    with Client(f"127.0.0.1:{cluster.router.port}") as client:
        done = client.generate(prompt_ids=IDS, max_tokens=3, ignore_eos=True, prompt_logprobs=2)
        chunks = list(
            client.generate_stream(prompt_ids=IDS, max_tokens=3, ignore_eos=True, prompt_logprobs=0)
        )
        plain = client.generate(prompt_ids=IDS, max_tokens=3, ignore_eos=True)
    scored = done.prompt_logprobs
    assert scored.token_ids == tuple(IDS) and list(scored.logprobs) == scorer(IDS)
    assert [len(top) for top in scored.top_logprobs] == [2] * (len(IDS) - 1)
    assert (
        chunks[0].prompt_logprobs.logprobs == scored.logprobs and chunks[0].prompt_logprobs.top_logprobs == ()
    )
    assert all(c.prompt_logprobs is None for c in chunks[1:]) and plain.prompt_logprobs is None
