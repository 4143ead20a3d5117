"""Several choices per request over a real cluster: ``n`` samples (seeded ``seed + j``), batched
prompts (prompt-major ``index``, usage summed), ``echo``, log-prob tokens named by their text and
bytes, streamed and whole; a client leaving a fanned-out stream frees every generation; the official
``openai`` SDK reads all of it."""

import json
import urllib.request
from collections import defaultdict

import openai
import pytest

from cli.main import main
from common.tokenizer import Tokenizer
from common.tokenizer.token_bytes import TokenBytes
from tests.router_http.client import OpenStream, post, stream
from tests.router_http.conftest import decode_idle, decode_running

PROMPTS = [list(range(40, 60)), list(range(100, 112))]
SAMPLED = {"max_tokens": 6, "temperature": 1.0, "ignore_eos": True, "return_token_ids": True}
GREEDY = {**SAMPLED, "temperature": 0}
USER = [{"role": "user", "content": "Hello Baton"}]


@pytest.fixture(scope="module")
def tokenizer(cluster) -> Tokenizer:
    return Tokenizer.from_pretrained(cluster.model)


@pytest.fixture(scope="module")
def pieces(tokenizer) -> TokenBytes:
    return TokenBytes(tokenizer)


def _name(pieces: TokenBytes, token_id: int) -> str:
    """The text a log-prob entry names a token by; an id of the model's vocabulary that the tiny
    tokenizer lacks (the tiny model's vocabulary is larger) has none: vLLM's ``token_id:<id>``."""
    return pieces.text(token_id) or f"token_id:{token_id}"


def _ids(reply) -> list[list[int]]:
    assert reply.status == 200, reply.body
    assert [c["index"] for c in reply.body["choices"]] == list(range(len(reply.body["choices"])))
    return [c["token_ids"] for c in reply.body["choices"]]


def _by_index(chunks: list[dict], key: str) -> dict[int, list]:
    """Each choice's values of ``key`` over a stream's chunks (lists concatenated, strings joined)."""
    joined: dict[int, list] = defaultdict(list)
    for chunk in chunks:
        for choice in chunk["choices"]:
            value = choice.get(key)
            joined[choice["index"]].extend(value if isinstance(value, list) else [value])
    return dict(joined)


def test_n_samples_are_the_seeded_single_requests_seed_plus_j(cluster):
    body = {**SAMPLED, "prompt": PROMPTS[0], "seed": 7}
    reply = post(cluster.port, "/v1/completions", {**body, "n": 3})
    together = _ids(reply)
    alone = [_ids(post(cluster.port, "/v1/completions", {**body, "seed": 7 + j}))[0] for j in range(3)]
    assert together == alone and len(together) == 3
    assert len({tuple(ids) for ids in together}) > 1  # different seeds, different samples
    usage = reply.body["usage"]  # the prompt counted once, as OpenAI does for n
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (len(PROMPTS[0]), 18)
    assert usage["total_tokens"] == len(PROMPTS[0]) + 18


def _cached_tokens(cluster) -> float:
    text = urllib.request.urlopen(
        f"http://127.0.0.1:{cluster.router.metrics_port}/metrics", timeout=10
    ).read()
    (line,) = [x for x in text.decode().splitlines() if x.startswith("baton_cached_prompt_tokens_total ")]
    return float(line.split()[1])


def test_n_samples_share_one_prefill_of_their_prompt(cluster):
    """The first sample is prefilled alone; its siblings, sent once it has its first token, find the
    prompt's whole blocks cached (the engine's blocks are 16 tokens: 48 of this 50-token prompt)."""
    prompt = list(range(300, 350))
    before = _cached_tokens(cluster)
    reply = post(cluster.port, "/v1/completions", {**SAMPLED, "prompt": prompt, "seed": 11, "n": 3})
    assert reply.status == 200 and len(reply.body["choices"]) == 3
    assert _cached_tokens(cluster) - before >= 2 * 48  # both siblings hit the first sample's blocks
    assert reply.body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # the first: a cold prefill


def test_greedy_n_gives_identical_choices(cluster):
    choices = post(cluster.port, "/v1/completions", {**GREEDY, "prompt": PROMPTS[0], "n": 2}).body["choices"]
    assert len(choices) == 2 and choices[0]["token_ids"] == choices[1]["token_ids"]
    assert choices[0]["text"] == choices[1]["text"]


def test_a_streamed_n_interleaves_indexed_chunks_that_equal_the_whole(cluster):
    body = {**SAMPLED, "prompt": PROMPTS[0], "seed": 3, "n": 3, "max_tokens": 8}
    whole = _ids(post(cluster.port, "/v1/completions", body))
    streamed = stream(cluster.port, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    assert streamed.status == 200 and streamed.events.count("[DONE]") == 1 and streamed.events[-1] == "[DONE]"
    *chunks, usage_chunk = streamed.chunks()
    assert all(len(c["choices"]) == 1 for c in chunks)
    assert _by_index(chunks, "token_ids") == dict(enumerate(whole))
    finishes = _by_index(chunks, "finish_reason")
    assert all(reasons[-1] == "length" and set(reasons[:-1]) <= {None} for reasons in finishes.values())
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 24
    assert usage_chunk["usage"]["prompt_tokens"] == len(PROMPTS[0])


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_a_batch_of_prompts_is_prompt_major_and_sums_usage(cluster, streamed):
    body = {**GREEDY, "prompt": PROMPTS, "n": 2}
    alone = [_ids(post(cluster.port, "/v1/completions", {**GREEDY, "prompt": p}))[0] for p in PROMPTS]
    if streamed:
        chunks = stream(cluster.port, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
        *chunks, usage_chunk = chunks.chunks()
        ids = _by_index(chunks, "token_ids")
        prompt_ids = {
            c["choices"][0]["index"]: c["choices"][0]["prompt_token_ids"]
            for c in chunks
            if "prompt_token_ids" in c["choices"][0]
        }
        usage = usage_chunk["usage"]
    else:
        reply = post(cluster.port, "/v1/completions", body)
        ids = dict(enumerate(_ids(reply)))
        prompt_ids = {c["index"]: c["prompt_token_ids"] for c in reply.body["choices"]}
        usage = reply.body["usage"]
    # index = prompt_index * n + j
    assert ids == {0: alone[0], 1: alone[0], 2: alone[1], 3: alone[1]}
    assert prompt_ids == {0: PROMPTS[0], 1: PROMPTS[0], 2: PROMPTS[1], 3: PROMPTS[1]}
    assert usage["prompt_tokens"] == len(PROMPTS[0]) + len(PROMPTS[1])
    assert usage["completion_tokens"] == 4 * 6
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_a_batch_of_texts_and_one_token_list_stay_as_sent(cluster):
    texts = post(cluster.port, "/v1/completions", {**GREEDY, "prompt": ["Hello", "Baton serves"]})
    assert len(_ids(texts)) == 2
    for i, text in enumerate(["Hello", "Baton serves"]):
        assert (
            texts.body["choices"][i]["text"]
            == post(cluster.port, "/v1/completions", {**GREEDY, "prompt": text}).body["choices"][0]["text"]
        )
    one = post(cluster.port, "/v1/completions", {**GREEDY, "prompt": PROMPTS[1]})
    assert len(one.body["choices"]) == 1 and one.body["choices"][0]["prompt_token_ids"] == PROMPTS[1]


def test_echo_prepends_the_prompt_whole_and_streamed(cluster, tokenizer):
    plain = post(cluster.port, "/v1/completions", {**GREEDY, "prompt": "Hello Baton"}).body["choices"][0]
    body = {**GREEDY, "prompt": ["Hello Baton", "Hi"], "echo": True}
    whole = post(cluster.port, "/v1/completions", body).body["choices"]
    assert whole[0]["text"] == "Hello Baton" + plain["text"] and whole[1]["text"].startswith("Hi")
    assert whole[0]["token_ids"] == plain["token_ids"]  # echo adds text, not generated tokens
    chunks = stream(cluster.port, "/v1/completions", body).chunks()
    firsts = {}
    for chunk in chunks:
        firsts.setdefault(chunk["choices"][0]["index"], chunk["choices"][0]["text"])
    assert firsts == {0: "Hello Baton", 1: "Hi"}  # the first chunk of each choice is its prompt
    assert "".join(_by_index(chunks, "text")[0]) == whole[0]["text"]
    decoded = tokenizer.decode(PROMPTS[0])
    echoed = post(cluster.port, "/v1/completions", {**GREEDY, "prompt": PROMPTS[0], "echo": True}).body
    assert echoed["choices"][0]["text"].startswith(decoded) and decoded


def test_logprob_tokens_are_their_text_and_token_ids_on_request(cluster, tokenizer, pieces):
    body = {**GREEDY, "prompt": PROMPTS[0], "logprobs": 2, "n": 2}
    for choice in post(cluster.port, "/v1/completions", body).body["choices"]:
        ids, logprobs = choice["token_ids"], choice["logprobs"]
        assert logprobs["tokens"] == [_name(pieces, t) for t in ids]
        assert all(logprobs["tokens"][k] in top for k, top in enumerate(logprobs["top_logprobs"]))
        if all(pieces.piece(t) is not None and t not in tokenizer.added_token_ids for t in ids):
            # the pieces' bytes make up the text exactly
            assert b"".join(pieces.piece(t) for t in ids).decode("utf-8", "replace") == choice["text"]
    as_ids = post(cluster.port, "/v1/completions", {**body, "return_tokens_as_token_ids": True}).body
    choice = as_ids["choices"][0]
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
    chat = {
        **GREEDY,
        "messages": USER,
        "logprobs": True,
        "top_logprobs": 1,
        "return_tokens_as_token_ids": True,
    }
    entry = post(cluster.port, "/v1/chat/completions", chat).body["choices"][0]["logprobs"]["content"][0]
    assert entry["token"].startswith("token_id:") and bytes(entry["bytes"]).decode() == entry["token"]


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_chat_n_gives_indexed_choices(cluster, streamed):
    body = {**SAMPLED, "messages": USER, "n": 2, "seed": 5}
    whole = post(cluster.port, "/v1/chat/completions", body)
    together = _ids(whole)
    alone = [
        _ids(post(cluster.port, "/v1/chat/completions", {**body, "n": 1, "seed": 5 + j}))[0] for j in (0, 1)
    ]
    assert together == alone
    if streamed:
        chunks = stream(cluster.port, "/v1/chat/completions", body).chunks()
        assert _by_index(chunks, "token_ids") == dict(enumerate(together))
        deltas = _by_index(chunks, "delta")
        assert all(
            d[0]["role"] == "assistant" and all("role" not in x for x in d[1:]) for d in deltas.values()
        )
        contents = {i: "".join(x.get("content", "") for x in d) for i, d in deltas.items()}
        assert contents == {c["index"]: c["message"]["content"] for c in whole.body["choices"]}


def test_client_disconnect_mid_fanned_out_stream_frees_every_generation(cluster):
    body = {"prompt": PROMPTS, "n": 2, "max_tokens": 4000, "ignore_eos": True}
    open_stream = OpenStream(cluster.port, "/v1/completions", body)
    try:
        assert open_stream.status == 200
        events = [json.loads(open_stream.next_event()) for _ in range(8)]
        assert all(e["choices"][0]["finish_reason"] is None for e in events)
        assert decode_running(cluster.decode) == 4
    finally:
        open_stream.close()
    assert decode_idle(cluster.decode, timeout_s=5.0), "the decode worker still holds abandoned choices"


def test_the_openai_sdk_reads_n_batches_echo_and_logprob_text(cluster, pieces):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{cluster.port}/v1", api_key="unused", max_retries=0)
    model = cluster.model.name
    batch = client.completions.create(
        model=model, prompt=["Hello", "Baton"], n=2, max_tokens=3, temperature=0, echo=True
    )
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert [c.text[:5] for c in batch.choices] == ["Hello", "Hello", "Baton", "Baton"]
    assert batch.usage.completion_tokens == 12
    scored = client.completions.create(
        model=model,
        prompt="Hello",
        max_tokens=3,
        temperature=0,
        logprobs=1,
        extra_body={"return_token_ids": True},
    )
    ids = scored.choices[0].model_extra["token_ids"]
    assert scored.choices[0].logprobs.tokens == [_name(pieces, t) for t in ids]
    streamed = client.completions.create(
        model=model, prompt=["a", "b"], max_tokens=3, temperature=0, stream=True
    )
    indices = {choice.index for chunk in streamed for choice in chunk.choices}
    assert indices == {0, 1}
    chat = client.chat.completions.create(
        model=model, messages=USER, n=2, max_tokens=3, temperature=0, logprobs=True, top_logprobs=2
    )
    assert [c.index for c in chat.choices] == [0, 1]
    for entry in chat.choices[0].logprobs.content:
        assert entry.bytes is None or bytes(entry.bytes).decode("utf-8", "replace") == entry.token
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].token == entry.token
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=model, prompt="x", n=17, max_tokens=1)
    assert refused.value.body["param"] == "n"


def test_serve_refuses_a_bad_max_n_before_starting_anything(tiny_checkpoint, capsys):
    model = str(tiny_checkpoint("kimi_linear"))
    assert main(["serve", "--model", model, "--max-n", "0"]) == 2
    assert "--max-n: must be >= 1, got 0" in capsys.readouterr().err
