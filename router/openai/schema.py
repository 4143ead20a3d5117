"""OpenAI request bodies parsed and validated into frozen dataclasses.

``parse_completion`` and ``parse_chat`` check every field they read (type, range) and refuse the
OpenAI features Baton does not serve, raising ``RequestError`` with the field's name; values the
router checks itself (vocabulary, stop strings against the model) come back from it as
INVALID_ARGUMENT. Unknown fields are ignored, as OpenAI-compatible servers do.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from common.limits import MAX_MESSAGES, MAX_PROMPT_BYTES, MAX_STOP_TOKEN_IDS
from common.sampling_params import LOGIT_BIAS_LIMIT, MAX_LOGIT_BIAS, MAX_LOGPROBS, PENALTY_LIMIT
from common.structured_output import StructuredOutput

from . import fields
from .fields import RequestError
from .response_format import parse_response_format
from .tool_fields import Tool, ToolCall, tool_calls, tool_choice, tools

DEFAULT_MAX_N = 16  # ``n``'s bound unless the router's ``--max-n`` says otherwise
MAX_PROMPTS = 64  # prompts in one /v1/completions batch: each becomes its own generation
_SEED_MODULUS = 2**63  # choice j samples with (seed + j) mod this: distinct, reproducible, in range
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


@dataclass(frozen=True)
class Sampling:
    """Sampling fields in the gRPC API's terms: ``top_p`` 0 is off, ``temperature`` 0 is greedy,
    ``max_tokens`` None takes the endpoint's default, ``logprobs`` None asks for none."""

    max_tokens: int | None
    temperature: float = 1.0
    top_p: float = 0.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    structured_output: StructuredOutput | None = None  # response_format


@dataclass(frozen=True)
class Options:
    """What both endpoints share besides sampling. ``model`` empty: the cluster's only model;
    ``timeout`` (seconds, an extension) becomes the gRPC deadline; ``no_migration`` (an extension):
    fail instead of moving the stream when its decode worker is lost (``GenerateRequest.no_migration``).
    ``n``: independent samples of each prompt (``choice_seed`` gives each its seed);
    ``return_tokens_as_token_ids`` (vLLM's flag): log-prob tokens as ``token_id:<id>``, not their text."""

    model: str
    stream: bool
    include_usage: bool
    return_token_ids: bool
    session_id: str
    tenant: str
    timeout: float | None
    no_migration: bool = False
    n: int = 1
    return_tokens_as_token_ids: bool = False


@dataclass(frozen=True)
class CompletionRequest:
    """``POST /v1/completions``: ``prompts`` holds one or more prompts (``MAX_PROMPTS`` at most), each
    a text or token ids; ``echo``: each choice's text starts with its prompt's text (and with
    ``logprobs`` its log-probs cover the prompt's tokens first); ``echo_only``: ``echo`` with
    ``max_tokens`` 0, each choice the prompt alone (one token is generated and dropped, as vLLM does:
    the workers have no prefill-only request)."""

    options: Options
    prompts: tuple[str | tuple[int, ...], ...]
    sampling: Sampling
    echo: bool = False
    echo_only: bool = False


@dataclass(frozen=True)
class ChatMessage:
    """``tool_calls``: an assistant turn's calls; ``tool_call_id`` / ``name``: a tool turn's."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    name: str = ""


@dataclass(frozen=True)
class ChatRequest:
    """``POST /v1/chat/completions``: the router renders ``messages`` (and ``tools``) with the model's
    template. ``tool_choice``: ``auto``, ``none``, ``required``, or the name of the one function to
    call; ``parallel_tool_calls`` False keeps the first parsed call only."""

    options: Options
    messages: tuple[ChatMessage, ...]
    sampling: Sampling
    tools: tuple[Tool, ...] = ()
    tool_choice: str = "auto"
    named_tool: bool = False  # tool_choice names a function (not one of the modes)
    parallel_tool_calls: bool = True


def parse_completion(
    body: Mapping[str, Any], headers: Mapping[str, str], max_n: int = DEFAULT_MAX_N
) -> CompletionRequest:
    """Validate a completions body (``n`` at most ``max_n``). Raises RequestError naming the field."""
    fields.only(body, "suffix", ("",), "not supported")
    logprobs = fields.integer(body, "logprobs", None, 0, MAX_LOGPROBS)
    echo = fields.boolean(body, "echo")
    echo_only = echo and type(body.get("max_tokens")) is int and body["max_tokens"] == 0
    if echo_only:  # lm-eval's loglikelihood call: the prompt's log-probs, nothing generated
        body = {**body, "max_tokens": 1}
    options = _options(body, headers, max_n)
    best_of = fields.integer(body, "best_of", None, 1)
    if best_of is not None and best_of != options.n:
        raise RequestError(
            "best_of", f"best_of: only best_of equal to n ({options.n}) is supported, got {best_of}"
        )
    prompts = _prompts(body.get("prompt"))
    sampling = _sampling(body, "max_tokens", 16, logprobs)
    return CompletionRequest(options, prompts, sampling, echo, echo_only)


def parse_chat(
    body: Mapping[str, Any], headers: Mapping[str, str], max_n: int = DEFAULT_MAX_N
) -> ChatRequest:
    """Validate a chat completions body (``n`` at most ``max_n``). Raises RequestError naming the field."""
    fields.only(body, "functions", ([],), "the legacy function-calling fields are not supported; use tools")
    fields.only(
        body, "function_call", (), "the legacy function-calling fields are not supported; use tool_choice"
    )
    declared = tools(body.get("tools"))
    choice, named = tool_choice(body.get("tool_choice"), declared)
    want_logprobs = fields.boolean(body, "logprobs")
    top = fields.integer(body, "top_logprobs", None, 0, MAX_LOGPROBS)
    if top is not None and not want_logprobs:
        raise RequestError("top_logprobs", "top_logprobs: needs logprobs: true")
    length_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    sampling = _sampling(body, length_field, None, (top or 0) if want_logprobs else None)
    return ChatRequest(
        _options(body, headers, max_n),
        _messages(body.get("messages")),
        sampling,
        tools=declared,
        tool_choice=choice,
        named_tool=named,
        parallel_tool_calls=fields.boolean(body, "parallel_tool_calls", True),
    )


def choice_seed(seed: int | None, j: int) -> int | None:
    """The seed of the ``j``-th sample of a prompt: ``seed + j`` (wrapping below 2**63), None unseeded."""
    return None if seed is None else (seed + j) % _SEED_MODULUS


def _options(body: Mapping[str, Any], headers: Mapping[str, str], max_n: int) -> Options:
    stream = fields.boolean(body, "stream")
    stream_options = body.get("stream_options")
    include_usage = False
    if stream_options is not None:
        if not stream:
            raise RequestError("stream_options", "stream_options: only allowed with stream: true")
        if not isinstance(stream_options, dict):
            raise RequestError("stream_options", "stream_options: must be an object")
        try:
            include_usage = fields.boolean(stream_options, "include_usage")
        except RequestError as error:
            raise RequestError("stream_options.include_usage", f"stream_options.{error.message}") from None
    n = fields.integer(
        body, "n", 1, 1, max_n, what=f"must be an integer in [1, {max_n}] (the router's --max-n)"
    )
    fields.string(body, "user")  # OpenAI's end-user label: unused, but still a bounded string
    return Options(
        model=fields.string(body, "model"),
        stream=stream,
        include_usage=include_usage,
        return_token_ids=fields.boolean(body, "return_token_ids"),
        session_id=fields.string(body, "session_id", headers.get("x-session-id", "")),
        tenant=fields.string(body, "tenant", headers.get("x-tenant", "")),
        timeout=fields.number(body, "timeout", None, 0.0, 86400.0, low_open=True),
        no_migration=fields.boolean(body, "no_migration"),
        n=n,
        return_tokens_as_token_ids=fields.boolean(body, "return_tokens_as_token_ids"),
    )


def _sampling(body: Mapping[str, Any], length_field: str, default_length, logprobs) -> Sampling:
    fields.only(body, "include_stop_str_in_output", (False,), "not supported")
    top_k = fields.integer(body, "top_k", 0, -1, 2**31 - 1)  # -1 is vLLM's "off"
    stop_ids = body.get("stop_token_ids")
    return Sampling(
        max_tokens=fields.integer(
            body, length_field, default_length, 1, what="must be a positive integer (below 2**32)"
        ),
        temperature=fields.number(body, "temperature", 1.0, 0.0, 1e6),
        top_p=fields.number(body, "top_p", 0.0, 0.0, 1.0, low_open=True),
        top_k=max(top_k, 0),
        min_p=fields.number(body, "min_p", 0.0, 0.0, 1.0),
        seed=fields.integer(body, "seed", None, 0, 2**63 - 1),
        stop=fields.strings(body, "stop"),
        stop_token_ids=()
        if stop_ids is None
        else fields.token_ids(stop_ids, "stop_token_ids", MAX_STOP_TOKEN_IDS),
        ignore_eos=fields.boolean(body, "ignore_eos"),
        logprobs=logprobs,
        logit_bias=_logit_bias(body.get("logit_bias")),
        presence_penalty=fields.number(body, "presence_penalty", 0.0, -PENALTY_LIMIT, PENALTY_LIMIT),
        frequency_penalty=fields.number(body, "frequency_penalty", 0.0, -PENALTY_LIMIT, PENALTY_LIMIT),
        repetition_penalty=_repetition_penalty(body.get("repetition_penalty")),
        structured_output=parse_response_format(body.get("response_format")),
    )


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``{"<token id>": bias}`` (JSON keys are strings) as ``(id, bias)`` pairs. The router
    checks the ids against the model's vocabulary."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise RequestError(
            "logit_bias", f"logit_bias: must be an object of token id to bias, got {fields.quote(value)}"
        )
    if len(value) > MAX_LOGIT_BIAS:
        raise RequestError(
            "logit_bias", f"logit_bias: {len(value)} entries, more than the limit of {MAX_LOGIT_BIAS}"
        )
    pairs = []
    for key, bias in value.items():
        token = int(key) if isinstance(key, str) and key.isascii() and key.isdigit() else None
        if token is None or token > fields.UINT32_MAX:
            raise RequestError(
                "logit_bias", f"logit_bias: keys must be token ids (integers >= 0), got {fields.quote(key)}"
            )
        limit = LOGIT_BIAS_LIMIT
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -limit <= bias <= limit:
            raise RequestError(
                "logit_bias",
                f"logit_bias: the bias of token {token} must be a number in [-100, 100], "
                f"got {fields.quote(bias)}",
            )
        pairs.append((token, float(bias)))
    return tuple(sorted(pairs))


def _repetition_penalty(value: Any) -> float:
    """vLLM's ``repetition_penalty``: a finite number > 0 (1 is off)."""
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise RequestError(
            "repetition_penalty",
            f"repetition_penalty: must be a finite number > 0 (1 is off), got {fields.quote(value)}",
        )
    return float(value)


def _prompts(prompt: Any) -> tuple[str | tuple[int, ...], ...]:
    """A text, token ids, or a batch: a list of texts or a list of token-id lists (not mixed)."""
    if prompt is None:
        raise RequestError("prompt", "prompt: required")
    if not (isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt)):
        return (_prompt(prompt, "prompt"),)  # a text, or one prompt's token ids
    if len(prompt) > MAX_PROMPTS:
        raise RequestError(
            "prompt", f"prompt: a batch of {len(prompt)} prompts, more than the limit of {MAX_PROMPTS}"
        )
    if len({type(p) for p in prompt}) > 1:
        raise RequestError(
            "prompt", "prompt: a batch is a list of texts or a list of token-id lists, not both"
        )
    # The field is named ``prompt`` either way: the router's errors name it so, and clients look for it.
    return tuple(_prompt(p, "prompt") for p in prompt)


def _prompt(prompt: Any, name: str) -> str | tuple[int, ...]:
    if isinstance(prompt, str):  # the router caps it in bytes; here: valid Unicode, bounded
        return fields.text(prompt, name, MAX_PROMPT_BYTES)
    ids = fields.token_ids(prompt, name)
    if not ids:
        raise RequestError(name, f"{name}: must not be empty")
    return ids


def _messages(messages: Any) -> tuple[ChatMessage, ...]:
    if messages is None:
        raise RequestError("messages", "messages: required")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages", "messages: must be a non-empty list of messages")
    if len(messages) > MAX_MESSAGES:
        raise RequestError(
            "messages", f"messages: {len(messages)} messages, more than the limit of {MAX_MESSAGES}"
        )
    return tuple(_message(message, f"messages[{i}]") for i, message in enumerate(messages))


def _message(message: Any, where: str) -> ChatMessage:
    if not isinstance(message, dict):
        raise RequestError(where, f"{where}: must be an object with role and content")
    role = message.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise RequestError(
            f"{where}.role", f"{where}.role: must be one of {sorted(_ROLES)}, got {fields.quote(role)}"
        )
    calls = tool_calls(message.get("tool_calls"), f"{where}.tool_calls") if role == "assistant" else ()
    if role != "assistant" and message.get("tool_calls"):
        raise RequestError(
            f"{where}.tool_calls", f"{where}.tool_calls: only assistant messages carry tool calls"
        )
    content = message.get("content")
    if content is None and role == "assistant":
        content = ""
    return ChatMessage(
        _ROLES[role],
        _content(content, f"{where}.content"),
        calls,
        tool_call_id=fields.string(message, "tool_call_id") if role == "tool" else "",
        name=fields.string(message, "name") if role == "tool" else "",
    )


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return fields.text(content, where, MAX_PROMPT_BYTES)
    if not isinstance(content, list):
        raise RequestError(where, f"{where}: must be a string or a list of text parts")
    texts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise RequestError(at, f"{at}: must be an object with type and text")
        if part.get("type") != "text":
            kind = part.get("type")
            raise RequestError(
                f"{at}.type", f"{at}.type: only 'text' parts are supported, got {fields.quote(kind)}"
            )
        if not isinstance(part.get("text"), str):
            raise RequestError(f"{at}.text", f"{at}.text: must be a string")
        texts.append(fields.text(part["text"], f"{at}.text", MAX_PROMPT_BYTES))
    return "\n".join(texts)
