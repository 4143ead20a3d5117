"""Building ``GenerateRequest`` / ``TokenizeRequest`` messages from keyword arguments, and the
metadata every call carries (``auth_metadata``: the bearer token).

Only type and shape are checked here (what protobuf would otherwise reject with an unhelpful
error, or silently get wrong, like a bare string given as ``stop``); values such as temperature
ranges are the server's to validate. A bad argument raises ``InvalidRequest`` naming it.
"""

import json
import operator
from collections.abc import Iterable, Mapping

from proto.baton.v1 import generation_pb2

from .chat import chat_pb
from .errors import InvalidRequest

_UINT32 = 2**32
_UINT64 = 2**64


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """``(("authorization", "Bearer <token>"),)``, or ``()`` for ``token=None`` (a router without
    ``--auth-token-file``). InvalidRequest naming ``token`` for one that could not travel as gRPC
    metadata (empty, or not printable ASCII without spaces)."""
    if token is None:
        return ()
    if not isinstance(token, str) or not token or not all(0x21 <= ord(char) <= 0x7E for char in token):
        raise InvalidRequest("token: expected a non-empty string of printable ASCII without spaces")
    return (("authorization", f"Bearer {token}"),)


def generate_request(
    prompt: str | None = None,
    *,
    prompt_ids: Iterable[int] | None = None,
    messages: Iterable[dict] | None = None,
    max_tokens: int = 0,
    temperature: float = 0.0,
    top_p: float = 0.0,
    top_k: int = 0,
    min_p: float = 0.0,
    seed: int | None = None,
    stop: Iterable[str] = (),
    stop_token_ids: Iterable[int] = (),
    ignore_eos: bool = False,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
    logit_bias: Mapping[int, float] | None = None,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    repetition_penalty: float = 0.0,
    structured_output: Mapping[str, object] | None = None,
    session_id: str = "",
    tenant: str = "",
    request_id: str = "",
    model: str = "",
    no_migration: bool = False,
    adapter: str = "",
    tools: Iterable[dict] | None = None,
    tool_choice: str | dict = "auto",
    parallel_tool_calls: bool = True,
) -> generation_pb2.GenerateRequest:
    """One ``GenerateRequest``.

    Args:
        prompt, prompt_ids, messages: exactly one: text, token ids, or a chat as a list of
            ``{"role": ..., "content": ...}`` dicts (rendered with the model's template, with the
            generation prompt added); OpenAI's shapes: an assistant turn may carry ``tool_calls``
            (content None), a tool turn ``tool_call_id`` (``sdk/chat.py``).
        max_tokens: tokens to generate at most; 0 means the server's default.
        temperature: 0 is greedy. top_p: 0 means off. top_k: 0 is off. min_p: 0 is off.
        seed: same seed, same tokens whatever the batch; None lets the server choose.
        stop: strings that end the generation (not included in the text).
        stop_token_ids: token ids that end the generation.
        ignore_eos: keep going past the end-of-sequence token.
        logprobs: None: none; 0: the sampled token's logprob; n: also the top n per token (of the
            distribution after logit_bias and the penalties, before temperature).
        prompt_logprobs: None: none; n: each prompt token's log-prob given the tokens before it (from
            the second token on) and its top n alternatives (server: n <= 20), in the first chunk
            (``GenerationChunk.prompt_logprobs``, ``Completion.prompt_logprobs``).
        logit_bias: token id -> bias added to its logit before sampling (server: [-100, 100], at
            most 300 ids, inside the vocabulary).
        presence_penalty, frequency_penalty: subtracted from a generated token's logit once / per
            occurrence (server: [-2, 2]); 0 is off.
        repetition_penalty: divides positive / multiplies negative logits of tokens in the prompt or
            the output (server: > 0); 0 or 1 is off.
        structured_output: what the output must match, one key: ``{"json_schema": schema}`` (a dict,
            or its JSON text), ``{"json_object": True}``, ``{"regex": pattern}`` (fullmatched) or
            ``{"grammar": lark_text}``; enforced while sampling (the server refuses a spec it cannot
            compile, naming ``sampling.structured_output.<kind>``). None: unconstrained.
        session_id: affinity key; a session's turns go to the same workers.
        tenant: prefix-cache isolation key.
        request_id: the server assigns one when empty.
        model: empty means the cluster's only model.
        no_migration: when the decode worker streaming this request is lost, fail with
            UNAVAILABLE instead of letting the router continue the stream on another one.
        adapter: a LoRA adapter loaded on the workers (``list_models`` lists them); empty: the base
            model.
        tools, tool_choice, parallel_tool_calls: a chat's functions, as OpenAI's fields (``sdk/chat.py``);
            parsed calls come back in ``Completion.tool_calls`` / ``GenerationChunk.tool_calls``.

    Raises:
        InvalidRequest: an argument of the wrong type or shape, named in the message.
    """
    prompts = (("prompt", prompt), ("prompt_ids", prompt_ids), ("messages", messages))
    given = [name for name, value in prompts if value is not None]
    if len(given) != 1:
        found = ", ".join(given) if given else "none"
        raise InvalidRequest(f"prompt: give exactly one of prompt, prompt_ids, messages (got {found})")
    sampling = generation_pb2.SamplingParameters(
        max_tokens=_uint("max_tokens", max_tokens),
        temperature=_number("temperature", temperature),
        top_p=_number("top_p", top_p),
        top_k=_uint("top_k", top_k),
        min_p=_number("min_p", min_p),
        stop=_strings("stop", stop),
        stop_token_ids=_ids("stop_token_ids", stop_token_ids),
        ignore_eos=_bool("ignore_eos", ignore_eos),
        logit_bias=_logit_bias(logit_bias),
        presence_penalty=_number("presence_penalty", presence_penalty),
        frequency_penalty=_number("frequency_penalty", frequency_penalty),
        repetition_penalty=_number("repetition_penalty", repetition_penalty),
    )
    if seed is not None:
        sampling.seed = _uint("seed", seed, limit=_UINT64)
    if logprobs is not None:
        sampling.logprobs = _uint("logprobs", logprobs)
    if structured_output is not None:
        _structured_output(structured_output, sampling.structured_output)
    request = generation_pb2.GenerateRequest(
        sampling=sampling,
        session_id=_string("session_id", session_id),
        tenant=_string("tenant", tenant),
        request_id=_string("request_id", request_id),
        model=_string("model", model),
        no_migration=_bool("no_migration", no_migration),
        adapter=_string("adapter", adapter),
    )
    if prompt is not None:
        request.text = _string("prompt", prompt)
    elif prompt_ids is not None:
        request.token_ids.ids.extend(_ids("prompt_ids", prompt_ids))
    else:
        request.chat.CopyFrom(
            chat_pb(
                messages,
                add_generation_prompt=True,
                tools=tools,
                tool_choice=tool_choice,
                parallel_tool_calls=parallel_tool_calls,
            )
        )
    if messages is None and tools is not None:
        raise InvalidRequest("tools: only with messages (a chat)")
    if prompt_logprobs is not None:
        request.prompt_logprobs = _uint("prompt_logprobs", prompt_logprobs)
    return request


def tokenize_request(
    text: str | None = None,
    *,
    messages: Iterable[dict] | None = None,
    add_generation_prompt: bool = True,
    model: str = "",
    tools: Iterable[dict] | None = None,
    tool_choice: str | dict = "auto",
) -> generation_pb2.TokenizeRequest:
    """One ``TokenizeRequest`` for exactly one of ``text`` or ``messages`` (a chat, as in
    ``generate_request``; ``add_generation_prompt`` appends the assistant turn's header)."""
    if (text is None) == (messages is None):
        raise InvalidRequest("text: give exactly one of text, messages")
    request = generation_pb2.TokenizeRequest(model=_string("model", model))
    if text is not None:
        request.text = _string("text", text)
    else:
        add = _bool("add_generation_prompt", add_generation_prompt)
        request.chat.CopyFrom(
            chat_pb(messages, add_generation_prompt=add, tools=tools, tool_choice=tool_choice)
        )
    return request


def requested_logprobs(request: generation_pb2.GenerateRequest) -> int | None:
    """The request's ``logprobs`` setting: None (not requested), 0, or n."""
    return request.sampling.logprobs if request.sampling.HasField("logprobs") else None


def _ids(name: str, ids) -> list[int]:
    if isinstance(ids, (str, bytes, Mapping)) or not isinstance(ids, Iterable):
        raise InvalidRequest(f"{name}: expected a list of token ids, got {_kind(ids)}")
    checked = []
    for position, token in enumerate(ids):
        value = _as_int(token)
        if value is None or not 0 <= value < _UINT32:
            raise InvalidRequest(
                f"{name}: {token!r} at position {position} is not a token id (an integer in [0, 2**32))"
            )
        checked.append(value)
    return checked


_STRUCTURED_KINDS = ("json_schema", "json_object", "regex", "grammar")


def _structured_output(value, message: generation_pb2.StructuredOutput) -> None:
    """``structured_output``'s one key written into ``message``; InvalidRequest naming it otherwise."""
    if not isinstance(value, Mapping) or len(value) != 1 or next(iter(value)) not in _STRUCTURED_KINDS:
        raise InvalidRequest(
            f"structured_output: expected a dict with one key of {', '.join(_STRUCTURED_KINDS)}, got "
            f"{_kind(value) if not isinstance(value, Mapping) else sorted(map(str, value))}"
        )
    ((kind, spec),) = value.items()
    if kind == "json_object":
        if spec is not True:
            raise InvalidRequest(f"structured_output.json_object: expected True, got {_kind(spec)}")
        message.json_object = True
        return
    if kind == "json_schema" and isinstance(spec, Mapping):
        spec = json.dumps(spec)
    setattr(message, kind, _string(f"structured_output.{kind}", spec))


def _logit_bias(value) -> dict[int, float]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidRequest(f"logit_bias: expected a dict of token id to bias, got {_kind(value)}")
    checked = {}
    for token, bias in value.items():
        key = _as_int(token)
        if key is None or not 0 <= key < _UINT32:
            raise InvalidRequest(f"logit_bias: {token!r} is not a token id (an integer in [0, 2**32))")
        checked[key] = _number(f"logit_bias[{key}]", bias)
    return checked


def _strings(name: str, values) -> list[str]:
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise InvalidRequest(f"{name}: expected a list of strings, got {_kind(values)}")
    values = list(values)
    for position, value in enumerate(values):
        if not isinstance(value, str):
            raise InvalidRequest(f"{name}: item {position} is {_kind(value)}, not a string")
    return values


def _uint(name: str, value, limit: int = _UINT32) -> int:
    checked = _as_int(value)
    if checked is None or not 0 <= checked < limit:
        raise InvalidRequest(
            f"{name}: expected a non-negative integer below 2**{limit.bit_length() - 1}, got {value!r}"
        )
    return checked


def _number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequest(f"{name}: expected a number, got {_kind(value)}")
    return float(value)


def _bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name}: expected True or False, got {_kind(value)}")
    return value


def _string(name: str, value) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"{name}: expected a string, got {_kind(value)}")
    return value


def _as_int(value) -> int | None:
    """``value`` as an int if it is one (numpy integers included, bools not), else None."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _kind(value) -> str:
    return type(value).__name__
