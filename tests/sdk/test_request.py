"""``generate_request`` / ``tokenize_request``: every argument lands in its protobuf field; wrong
types and shapes raise ``InvalidRequest`` naming the argument (values are the server's to judge)."""

import pytest

from proto.baton.v1 import generation_pb2
from sdk import InvalidRequest, generate_request, tokenize_request
from sdk.request import requested_logprobs


def test_every_argument_reaches_its_field():
    request = generate_request(
        "Hello",
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        seed=2**40,
        stop=["\n", "END"],
        stop_token_ids=[2, 3],
        ignore_eos=True,
        logprobs=4,
        logit_bias={7: -100, 3: 2.5},
        presence_penalty=0.5,
        frequency_penalty=-1.0,
        repetition_penalty=1.25,
        session_id="s-1",
        tenant="acme",
        request_id="r-9",
        model="k3-tiny",
        no_migration=True,
    )
    sampling = request.sampling
    assert request.WhichOneof("prompt") == "text" and request.text == "Hello"
    assert (sampling.max_tokens, sampling.top_k, sampling.seed, sampling.logprobs) == (7, 40, 2**40, 4)
    assert sampling.temperature == pytest.approx(0.5) and sampling.top_p == pytest.approx(0.9)
    assert sampling.min_p == pytest.approx(0.05)
    assert list(sampling.stop) == ["\n", "END"] and list(sampling.stop_token_ids) == [2, 3]
    assert sampling.ignore_eos
    assert dict(sampling.logit_bias) == {7: -100.0, 3: 2.5}
    assert (sampling.presence_penalty, sampling.frequency_penalty, sampling.repetition_penalty) == (
        0.5,
        -1.0,
        1.25,
    )
    assert (request.session_id, request.tenant, request.request_id, request.model) == (
        "s-1",
        "acme",
        "r-9",
        "k3-tiny",
    )
    assert request.no_migration


def test_unset_optionals_stay_unset():
    request = generate_request(prompt_ids=[5])
    assert not request.sampling.HasField("seed") and not request.sampling.HasField("logprobs")
    assert requested_logprobs(request) is None and not request.no_migration
    assert requested_logprobs(generate_request(prompt_ids=[5], logprobs=0)) == 0


def test_prompt_ids_and_messages_fill_their_oneof():
    ids = generate_request(prompt_ids=(4, 5, 6))
    assert ids.WhichOneof("prompt") == "token_ids" and list(ids.token_ids.ids) == [4, 5, 6]
    chat = generate_request(
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    )
    assert chat.WhichOneof("prompt") == "chat" and chat.chat.add_generation_prompt
    assert [(m.role, m.content) for m in chat.chat.messages] == [("system", "be brief"), ("user", "hi")]


@pytest.mark.parametrize(
    "kwargs, named",
    [
        (
            {"prompt": "a", "prompt_ids": [1]},
            "prompt: give exactly one of prompt, prompt_ids, messages (got prompt, prompt_ids)",
        ),
        ({}, "got none"),
        ({"prompt_ids": [1, -2]}, "prompt_ids: -2 at position 1"),
        ({"prompt_ids": [1, 2**32]}, "prompt_ids: 4294967296 at position 1"),
        ({"prompt_ids": [1, 2.5]}, "prompt_ids: 2.5 at position 1"),
        ({"prompt_ids": "1,2"}, "prompt_ids: expected a list"),
        ({"prompt": ["a"]}, "prompt: expected a string"),
        ({"messages": [{"role": "user"}]}, "messages[0]"),
        ({"messages": {"role": "user", "content": "x"}}, "messages: expected a list"),
        ({"prompt": "a", "stop": "END"}, "stop: expected a list of strings"),
        ({"prompt": "a", "stop": ["END", 3]}, "stop: item 1"),
        ({"prompt": "a", "max_tokens": -1}, "max_tokens"),
        ({"prompt": "a", "max_tokens": 1.5}, "max_tokens"),
        ({"prompt": "a", "seed": -1}, "seed"),
        ({"prompt": "a", "logprobs": True}, "logprobs"),
        ({"prompt": "a", "temperature": "hot"}, "temperature"),
        ({"prompt": "a", "stop_token_ids": [-1]}, "stop_token_ids"),
        ({"prompt": "a", "ignore_eos": 1}, "ignore_eos"),
        ({"prompt": "a", "tenant": None}, "tenant"),
        ({"prompt": "a", "no_migration": "yes"}, "no_migration"),
        ({"prompt": "a", "logit_bias": [(1, 2.0)]}, "logit_bias: expected a dict"),
        ({"prompt": "a", "logit_bias": {"1": 2.0}}, "logit_bias: '1' is not a token id"),
        ({"prompt": "a", "logit_bias": {-1: 2.0}}, "logit_bias: -1 is not a token id"),
        ({"prompt": "a", "logit_bias": {1: "up"}}, "logit_bias[1]"),
        ({"prompt": "a", "presence_penalty": "x"}, "presence_penalty"),
        ({"prompt": "a", "repetition_penalty": None}, "repetition_penalty"),
        ({"prompt": "a", "prompt_logprobs": -1}, "prompt_logprobs"),
        ({"prompt": "a", "prompt_logprobs": 1.5}, "prompt_logprobs"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_bad_shapes_are_rejected_naming_the_argument(kwargs, named):
    with pytest.raises(InvalidRequest) as raised:
        generate_request(**kwargs)
    assert named in raised.value.details


def test_values_are_left_to_the_server():
    request = generate_request(  # the server rejects these
        prompt_ids=[], temperature=-3.0, top_p=7.0, presence_penalty=9.0, logit_bias={5: 1000}
    )
    assert request.sampling.temperature == -3.0 and list(request.token_ids.ids) == []
    assert request.sampling.presence_penalty == 9.0 and dict(request.sampling.logit_bias) == {5: 1000.0}


def test_tokenize_request_takes_text_or_messages():
    assert tokenize_request("hi").text == "hi"
    chat = tokenize_request(messages=[{"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert chat.WhichOneof("input") == "chat" and not chat.chat.add_generation_prompt
    with pytest.raises(InvalidRequest, match="exactly one of text, messages"):
        tokenize_request("hi", messages=[])
    assert isinstance(chat, generation_pb2.TokenizeRequest)
