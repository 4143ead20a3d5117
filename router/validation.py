"""Checks on a public gRPC request's fields, run before tokenization or any worker is involved.

What protobuf already guarantees is not checked again: a ``string`` field holds valid UTF-8 (bad
bytes fail to parse, and the error interceptor answers INVALID_ARGUMENT), numbers fit their type.
What is checked here: labels and stop strings within their size limits (``common/limits.py``),
stop token ids and ``logit_bias`` ids inside the vocabulary, ``prompt_logprobs`` within
``MAX_LOGPROBS``, the chat's message count and tools, and the
prompt's byte size against the absolute cap and the cheap token bound. ``sampling_from_pb`` checks
the sampling ranges (penalties, bias values).
"""

from common.limits import (
    MAX_LABEL_CHARS,
    MAX_MESSAGES,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    FieldError,
    check_count,
    check_prompt_bytes,
    check_text,
    utf8_bytes,
)
from common.sampling_params import MAX_LOGIT_BIAS, MAX_LOGPROBS
from proto.baton.v1 import generation_pb2

from .chat_tools import check_chat_tools


def check_generate(
    request: generation_pb2.GenerateRequest, vocab_size: int, max_token_bytes: int | None, max_model_len: int
) -> None:
    """Refuse a ``GenerateRequest`` whose fields break a limit; raises FieldError naming the field
    (``request_id``, ``sampling.stop[1]``, ``chat.messages[3].role``, ``text``, ...)."""
    for name in ("request_id", "model", "session_id", "tenant", "adapter"):
        check_text(getattr(request, name), name, MAX_LABEL_CHARS)
    sampling = request.sampling
    check_count(len(sampling.stop), "sampling.stop", MAX_STOP_STRINGS, "stop strings")
    for j, stop in enumerate(sampling.stop):
        check_text(stop, f"sampling.stop[{j}]", MAX_STOP_CHARS)
    check_count(len(sampling.stop_token_ids), "sampling.stop_token_ids", MAX_STOP_TOKEN_IDS, "ids")
    for j, token in enumerate(sampling.stop_token_ids):
        if token >= vocab_size:
            raise FieldError(
                f"sampling.stop_token_ids[{j}]", f"id {token} is outside the vocabulary [0, {vocab_size})"
            )
    check_count(len(sampling.logit_bias), "sampling.logit_bias", MAX_LOGIT_BIAS, "entries")
    for token in sorted(sampling.logit_bias):
        if token >= vocab_size:
            raise FieldError("sampling.logit_bias", f"id {token} is outside the vocabulary [0, {vocab_size})")
    if request.HasField("prompt_logprobs") and request.prompt_logprobs > MAX_LOGPROBS:
        raise FieldError(
            "prompt_logprobs", f"must be between 0 and {MAX_LOGPROBS} or unset, got {request.prompt_logprobs}"
        )
    kind = request.WhichOneof("prompt")
    if kind == "text":
        check_prompt_bytes(utf8_bytes(request.text, "text"), "text", max_token_bytes, max_model_len)
    elif kind == "chat":  # the token bound applies to the rendered text (a template may drop parts)
        check_prompt_bytes(chat_bytes(request.chat), "chat", None, max_model_len)


def check_tokenize(request: generation_pb2.TokenizeRequest) -> None:
    """Refuse a ``TokenizeRequest`` whose model label or input breaks a limit (no token bound: a
    text longer than the model may still be tokenized)."""
    check_text(request.model, "model", MAX_LABEL_CHARS)
    if request.WhichOneof("input") == "chat":
        check_prompt_bytes(chat_bytes(request.chat), "chat", None, 0)
    else:
        check_prompt_bytes(utf8_bytes(request.text, "text"), "text", None, 0)


def chat_bytes(chat: generation_pb2.Chat) -> int:
    """The UTF-8 bytes of a chat's contents together (tools and tool calls included), after checking its
    message count, roles and tools (``chat_tools.py``). The rendered prompt holds more (the template's
    markup): this is what the client controls."""
    check_count(len(chat.messages), "chat.messages", MAX_MESSAGES, "messages")
    size = check_chat_tools(chat)
    for i, message in enumerate(chat.messages):
        check_text(message.role, f"chat.messages[{i}].role", MAX_LABEL_CHARS)
        size += utf8_bytes(message.content, f"chat.messages[{i}].content")
    return size
