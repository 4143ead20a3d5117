"""Size limits on a request's fields, checked before any expensive work (tokenization, the workers).

Both fronts use them: the gRPC servicer (``router/validation.py``) and the OpenAI HTTP front
(``router/openai/schema.py``). The sampling fields' ranges (``MAX_LOGPROBS``, the seed) are checked
with the parameters themselves, in ``sampling_params.py``.

Why each limit exists: labels are echoed in every streamed message and used as keys, so a long one
amplifies (a 1 MiB ``request_id`` over 50 tokens sent 49 MiB back); stop strings are searched in the
text after every token; a prompt costs tokenizer CPU in proportion to its bytes (about 1.5 s per MB),
so one that cannot fit ``max_model_len`` is refused from its byte length alone (``min_tokens``).
"""

MAX_LABEL_CHARS = 256  # request_id, model, session_id, tenant, user, a chat message's role
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256  # each stop string
MAX_STOP_TOKEN_IDS = 256
MAX_MESSAGES = 4096  # chat messages in one request
MAX_PROMPT_BYTES = 8 * 2**20  # a text prompt, or a chat's contents together (1M tokens is ~4 MB of text)


class FieldError(ValueError):
    """A request field the router refuses: ``str(error)`` is ``"<field>: <problem>"``, ``field`` the
    field as the client spelled it (``stop[2]``, ``messages[0].content``). A ``ValueError``, so the
    gRPC error interceptor answers INVALID_ARGUMENT."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field


def utf8_bytes(value: str, field: str) -> int:
    """The UTF-8 length of ``value``. Raises FieldError when it holds a lone UTF-16 surrogate (JSON's
    ``"\\ud800"`` escape, or a header byte decoded with ``surrogateescape``): no valid text does, and
    neither the tokenizer nor protobuf can encode one."""
    if value.isascii():
        return len(value)
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError as error:
        code = ord(value[error.start])
        raise FieldError(
            field,
            f"holds a lone UTF-16 surrogate U+{code:04X} at character {error.start}; send valid Unicode",
        ) from None


def check_text(value: str, field: str, max_chars: int) -> None:
    """Refuse ``value`` when it is longer than ``max_chars`` characters or not valid Unicode."""
    if len(value) > max_chars:
        raise FieldError(field, f"{len(value)} characters, more than the limit of {max_chars}")
    utf8_bytes(value, field)


def check_count(count: int, field: str, limit: int, what: str) -> None:
    """Refuse more than ``limit`` items of a list field (``what`` names the items)."""
    if count > limit:
        raise FieldError(field, f"{count} {what}, more than the limit of {limit}")


def check_prompt_bytes(size: int, field: str, max_token_bytes: int | None, max_model_len: int) -> None:
    """Refuse a prompt of ``size`` UTF-8 bytes that cannot fit, before tokenizing it.

    No vocabulary entry covers more than ``max_token_bytes`` bytes of text, so the prompt has at
    least ``ceil(size / max_token_bytes)`` tokens; when that leaves no room under ``max_model_len``
    it is refused at once. ``max_token_bytes`` None (a tokenizer for which no such bound holds)
    leaves only the absolute cap ``MAX_PROMPT_BYTES``.
    """
    if size > MAX_PROMPT_BYTES:
        raise FieldError(field, f"{size} bytes, more than the limit of {MAX_PROMPT_BYTES} bytes")
    if max_token_bytes:
        at_least = -(-size // max_token_bytes)
        if at_least >= max_model_len:
            raise FieldError(
                field,
                f"{size} bytes make at least {at_least} tokens, which leave no room under "
                f"max_model_len ({max_model_len})",
            )


def check_prompt_tokens(count: int, field: str, max_model_len: int) -> None:
    """Refuse a tokenized prompt that leaves no room for one generated token (the engine's rule)."""
    if count >= max_model_len:
        raise FieldError(field, f"{count} tokens leave no room under max_model_len ({max_model_len})")
