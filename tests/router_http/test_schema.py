"""The front's request parsing and translation without a server: defaults in the gRPC API's terms,
extension fields and headers, OpenAI shapes accepted, router errors mapped to OpenAI fields."""

import grpc
import pytest

from common.sampling_pb import sampling_from_pb
from proto.baton.v1 import generation_pb2
from router.openai.errors import from_rpc_error
from router.openai.fields import RequestError
from router.openai.schema import parse_chat, parse_completion
from router.openai.translate import chat_to_pb, completion_to_pb


def test_completion_defaults_follow_openai_in_the_grpc_apis_terms():
    message = completion_to_pb(parse_completion({"prompt": "hi"}, {}), "r1")
    assert message.request_id == "r1" and message.text == "hi" and message.model == ""
    sampling = message.sampling
    assert sampling.max_tokens == 16 and sampling.temperature == 1.0  # OpenAI's defaults
    assert sampling.top_p == 0 and sampling.top_k == 0 and sampling.min_p == 0  # 0: off
    assert not sampling.HasField("seed") and not sampling.HasField("logprobs")
    assert list(sampling.stop) == [] and not sampling.ignore_eos and not message.no_migration


def test_completion_fields_reach_the_grpc_request():
    body = {
        "model": "m",
        "prompt": [[3, 4, 5]],  # a batch of one
        "max_tokens": 7,
        "temperature": 0,
        "top_p": 0.5,
        "top_k": -1,  # vLLM's "off"
        "min_p": 0.1,
        "seed": 11,
        "stop": "\n",
        "stop_token_ids": [2],
        "ignore_eos": True,
        "logprobs": 0,
        "no_migration": True,
        "user": "ignored",
        "frequency_penalty": 0,
        "suffix": None,
    }
    message = completion_to_pb(parse_completion(body, {"x-session-id": "s", "x-tenant": "t"}), "r")
    assert message.model == "m" and list(message.token_ids.ids) == [3, 4, 5]
    assert (message.session_id, message.tenant, message.no_migration) == ("s", "t", True)
    s = message.sampling
    assert (s.max_tokens, s.temperature, s.top_k, s.seed, s.logprobs) == (7, 0.0, 0, 11, 0)
    assert s.top_p == pytest.approx(0.5) and s.min_p == pytest.approx(0.1)
    assert list(s.stop) == ["\n"] and list(s.stop_token_ids) == [2] and s.ignore_eos


def test_body_session_and_tenant_win_over_headers():
    parsed = parse_completion({"prompt": "x", "session_id": "a", "tenant": "b"}, {"x-tenant": "h"})
    assert (parsed.options.session_id, parsed.options.tenant) == ("a", "b")


def test_chat_messages_and_defaults():
    body = {
        "messages": [
            {"role": "developer", "content": "rules"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None},
        ],
        "logprobs": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    parsed = parse_chat(body, {})
    message = chat_to_pb(parsed, "r", max_model_len=4096)
    assert [(m.role, m.content) for m in message.chat.messages] == [
        ("system", "rules"),
        ("user", "a\nb"),
        ("assistant", ""),
    ]
    assert message.chat.add_generation_prompt
    assert message.sampling.max_tokens == 4096  # no max_tokens: up to the model length, as OpenAI
    assert message.sampling.logprobs == 0  # logprobs without top_logprobs: the sampled token's only
    assert parsed.options.stream and parsed.options.include_usage


@pytest.mark.parametrize(
    "body, param",
    [
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"id": "x"}]}]}, "messages[0].tool_calls[0]"),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, "tool_choice"),
        ({"messages": [{"role": "user", "content": "x"}], "presence_penalty": 2.5}, "presence_penalty"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
        ({"messages": [{"role": "user", "content": "x"}], "no_migration": 1}, "no_migration"),
    ],
    ids=["content-type", "tool-calls", "tool-choice", "penalty", "stream-type", "no-migration-type"],
)
def test_chat_refusals_name_the_field(body, param):
    with pytest.raises(RequestError) as caught:
        parse_chat(body, {})
    assert caught.value.param == param and caught.value.message.startswith(f"{param}:")


class _RpcError(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


@pytest.mark.parametrize(
    "code, details, chat, status, param, message",
    [
        (
            grpc.StatusCode.INVALID_ARGUMENT,
            "sampling.top_p: must be in (0, 1]",
            False,
            400,
            "top_p",
            "top_p: must",
        ),
        (
            grpc.StatusCode.INVALID_ARGUMENT,
            "token_ids: id 9 is outside",
            False,
            400,
            "prompt",
            "prompt: id 9",
        ),
        (
            grpc.StatusCode.INVALID_ARGUMENT,
            "prompt: the prompt is empty",
            True,
            400,
            "messages",
            "messages: the",
        ),
        (grpc.StatusCode.NOT_FOUND, "unknown request", False, 404, None, "unknown request"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "router queue full", False, 429, None, "router queue full"),
        (grpc.StatusCode.UNAVAILABLE, "decode worker any: down", False, 503, None, "decode worker any: down"),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", False, 504, None, "Deadline Exceeded"),
        (grpc.StatusCode.CANCELLED, "cancelled", False, 499, None, "cancelled"),
        (grpc.StatusCode.INTERNAL, "boom", False, 500, None, "boom"),
    ],
    ids=[
        "field",
        "token-ids",
        "chat-prompt",
        "not-found",
        "full",
        "unavailable",
        "deadline",
        "cancel",
        "other",
    ],
)
def test_router_status_codes_map_to_http(code, details, chat, status, param, message):
    got_status, body = from_rpc_error(_RpcError(code, details), chat)
    assert got_status == status and body["error"]["param"] == param
    assert body["error"]["message"].startswith(message) and body["error"]["code"] == code.name.lower()


def test_a_finished_request_without_logprobs_is_plain():
    from router.openai.responses import Transcript

    transcript = Transcript(False, "cmpl-1", "m", 0, None, False, None)
    final = generation_pb2.GenerateResponse(
        token_ids=[5], text="x", finish_reason=generation_pb2.FINISH_REASON_STOP
    )
    final.usage.prompt_tokens, final.usage.completion_tokens = 3, 1
    chunk = transcript.chunk(final)
    assert chunk["choices"] == [{"index": 0, "text": "x", "logprobs": None, "finish_reason": "stop"}]
    response = transcript.response()
    assert response["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 1,
        "total_tokens": 4,
        "prompt_tokens_details": {"cached_tokens": 0, "cached_tokens_host": 0},
    }


def test_logit_bias_and_penalties_reach_the_message_and_the_engines_params():
    body = {
        "prompt": "x",
        "logit_bias": {"7": -100, "3": 2.5},
        "presence_penalty": 0.5,
        "frequency_penalty": -1,
        "repetition_penalty": 1.25,
    }
    sampling = completion_to_pb(parse_completion(body, {}), "r").sampling
    assert dict(sampling.logit_bias) == {7: -100.0, 3: 2.5}
    assert (sampling.presence_penalty, sampling.frequency_penalty, sampling.repetition_penalty) == (
        0.5,
        -1.0,
        1.25,
    )
    params = sampling_from_pb(sampling)
    assert params.logit_bias == ((3, 2.5), (7, -100.0)) and params.processes_logits
    plain = sampling_from_pb(completion_to_pb(parse_completion({"prompt": "x"}, {}), "r").sampling)
    assert plain.repetition_penalty == 1.0 and not plain.processes_logits  # unset: off


def test_speculative_drafts_are_completion_tokens_details_summed_over_choices():
    """A request its decode worker drafted for reports its drafts accepted into the output and rejected
    (OpenAI's prediction counts); one that drafted nothing has no ``completion_tokens_details``."""
    from router.openai.responses import Transcript, response

    def finished(index: int, drafted: int, accepted: int) -> Transcript:
        transcript = Transcript(
            False, "cmpl-1", "m", 0, None, False, None, index=index, counts_prompt=index == 0
        )
        final = generation_pb2.GenerateResponse(
            token_ids=[5], finish_reason=generation_pb2.FINISH_REASON_LENGTH
        )
        final.usage.prompt_tokens, final.usage.completion_tokens = 3, 9
        final.usage.draft_tokens, final.usage.accepted_draft_tokens = drafted, accepted
        transcript.chunk(final)
        return transcript

    plain = finished(0, 0, 0)
    assert "completion_tokens_details" not in plain.response()["usage"]
    drafted = finished(0, 12, 7)
    details = {"accepted_prediction_tokens": 7, "rejected_prediction_tokens": 5}
    assert drafted.response()["usage"]["completion_tokens_details"] == details
    together = response([drafted, finished(1, 4, 4), finished(2, 0, 0)])["usage"]
    assert together["completion_tokens_details"] == {
        "accepted_prediction_tokens": 11,
        "rejected_prediction_tokens": 5,
    }
    assert together["completion_tokens"] == 27 and together["prompt_tokens"] == 3
