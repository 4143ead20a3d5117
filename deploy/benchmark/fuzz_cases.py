"""Bad (and some good) requests for the public APIs, drawn from one ``random.Random``.

``make_case(rng)`` returns one ``FuzzCase``: an HTTP body for ``/v1/completions`` or
``/v1/chat/completions`` (a valid body with fields replaced by values of random types, a random
JSON tree, deep nesting, broken bytes, a wrong ``Content-Type``) or gRPC bytes for ``Generate``,
``Tokenize`` or ``ListModels`` (random message fields within their protobuf types, or bytes that
are not the message at all). Only ``rng``'s methods are used, so ``baton bench fuzz`` passes a
seeded ``random.Random`` and the property tests a Hypothesis ``randoms()`` (which shrinks).
Generation is kept short: a valid request asks for a few tokens unless a mutation says otherwise.
"""

import json
import math
import random
from dataclasses import dataclass

from proto.baton.v1 import generation_pb2

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
GENERATE, TOKENIZE, LIST_MODELS = (
    "/baton.v1.Generation/Generate",
    "/baton.v1.Generation/Tokenize",
    "/baton.v1.Generation/ListModels",
)
_SAMPLING_FIELDS = (
    "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
    "stop_token_ids", "ignore_eos", "logprobs", "top_logprobs", "n", "best_of", "echo", "suffix",
    "logit_bias", "frequency_penalty", "presence_penalty", "stream", "stream_options", "user",
    "model", "session_id", "tenant", "timeout", "return_token_ids", "tools", "tool_choice",
    "response_format", "include_stop_str_in_output", "repetition_penalty",
)  # fmt: skip
_SPECIAL = ("<|im_end|>", "<|im_user|>", "<|im_middle|>", "[BOS]", "{{ raise }}", "{% for %}")
_DEEP = "@@deep@@"  # stands for the nested JSON text until the body is serialized
_CONTENT_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data", "", "json")


@dataclass(frozen=True)
class FuzzCase:
    """One request. ``surface``: ``http`` or ``grpc``; ``method``: the HTTP path or gRPC method;
    ``kind``: how it was made (for the report); ``payload``: the body or serialized message;
    ``content_type``: the HTTP header (None: not sent); ``client_timeout``: the ``timeout`` an
    HTTP body asks for (a 504 then is the answer it asked for)."""

    surface: str
    method: str
    kind: str
    payload: bytes
    content_type: str | None = None
    client_timeout: float | None = None


def make_case(rng: random.Random) -> FuzzCase:
    """One case: HTTP about half of the time, gRPC the other half."""
    if rng.random() < 0.5:
        return http_case(rng, CHAT if rng.random() < 0.5 else COMPLETIONS)
    return grpc_case(rng)


def text(rng: random.Random) -> str:
    """A string from the shapes that break servers: empty, control and astral characters, lone
    surrogates, template and special-token syntax, or long (up to 256 Ki characters)."""
    shape = rng.randrange(8)
    if shape == 0:
        return ""
    if shape == 1:
        return "".join(chr(rng.randrange(0x20, 0x7F)) for _ in range(rng.randrange(1, 40)))
    if shape == 2:  # anywhere in Unicode, surrogates included
        return "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randrange(1, 40)))
    if shape == 3:
        return chr(rng.randrange(0xD800, 0xE000)) + "hi" * rng.randrange(3)
    if shape == 4:
        return rng.choice(_SPECIAL) * rng.randrange(1, 5)
    if shape == 5:
        return rng.choice("ab \n\x00é中😀") * rng.randrange(1, 1 << rng.randrange(1, 19))
    if shape == 6:
        return "\u0301\u200b\ufeff\u202e\uffff"[rng.randrange(5)] * rng.randrange(1, 300)
    return rng.choice(("hello", "the cat", "1 2 3", "user"))


def json_value(rng: random.Random, depth: int = 0) -> object:
    """A random JSON value, containers shallower as ``depth`` grows."""
    shape = rng.randrange(9 if depth < 4 else 7)
    if shape == 0:
        return None
    if shape == 1:
        return rng.random() < 0.5
    if shape == 2:
        return rng.choice((0, 1, -1, 2**31, 2**32, 2**63, 2**64, -(2**63), 10**30, 7))
    if shape == 3:
        return rng.choice((0.0, -0.0, 0.5, 1.5, -1e-9, 1e308, -1e308, 1e-320, math.inf, -math.inf, math.nan))
    if shape in (4, 5, 6):
        return text(rng)
    if shape == 7:
        return [json_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    keys = ("role", "content", "type", "text", "include_usage", text(rng))
    return {rng.choice(keys): json_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def nested(rng: random.Random) -> bytes:
    """JSON text of lists and objects nested 20 to 100,000 deep (past any recursion limit), as
    text: a Python object that deep could not be serialized."""
    depth = rng.choice((20, 33, 64, 999, 1001, 5000, 100_000))
    opens = [b"[" if rng.random() < 0.7 else b'{"content": ' for _ in range(depth)]
    closes = [b"]" if part == b"[" else b"}" for part in reversed(opens)]
    return b"".join(opens) + rng.choice((b"1", b'"x"', b"null", b"[]")) + b"".join(closes)


def _valid_body(rng: random.Random, path: str) -> dict:
    body: dict = {"max_tokens": rng.randrange(1, 4), "temperature": rng.choice((0.0, 0.7))}
    if path == CHAT:
        body["messages"] = [{"role": "user", "content": rng.choice(("hi", "the cat sat"))}]
    else:
        body["prompt"] = rng.choice(("hello", [1, 2, 3]))
    if rng.random() < 0.3:
        body["stream"] = True
    return body


def http_case(rng: random.Random, path: str) -> FuzzCase:
    """A body for ``path`` (``COMPLETIONS`` or ``CHAT``): valid, mutated, random, deep or broken."""
    kind = rng.choice(("fields", "fields", "fields", "tree", "deep", "bytes", "content-type", "valid"))
    body: object = _valid_body(rng, path)
    if kind == "fields":
        for _ in range(rng.randrange(1, 4)):
            name = rng.choice(_SAMPLING_FIELDS + ("prompt", "messages", text(rng)))
            body[name] = _field_value(rng, name)
    elif kind == "tree":
        if rng.random() < 0.3:
            body = json_value(rng)
        else:  # known fields, each a random JSON tree
            names = _SAMPLING_FIELDS + ("prompt", "messages")
            body.update((rng.choice(names), json_value(rng)) for _ in range(rng.randrange(1, 6)))
    elif kind == "deep":
        body[rng.choice(("prompt", "messages", "stop", "extra"))] = _DEEP
    raw = _dumps(rng, body).replace(b'"' + _DEEP.encode() + b'"', nested(rng) if kind == "deep" else b"")
    timeout = body.get("timeout") if isinstance(body, dict) else None
    timeout = timeout if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) else None
    content_type = "application/json" if rng.random() < 0.9 else None
    if kind == "bytes":
        raw = _broken(rng, raw)
    elif kind == "content-type":
        choice = rng.choice(_CONTENT_TYPES)
        content_type = "application/json; charset=utf-8" if choice == "json" else choice
    return FuzzCase("http", path, kind, raw, content_type, timeout)


def _field_value(rng: random.Random, name: str) -> object:
    """A value for field ``name``: often one near its edges, else anything."""
    if rng.random() < 0.4:
        return json_value(rng)
    if name == "messages":
        roles = ("user", "system", "assistant", "tool", "developer", "bot", "")
        count = rng.choice((0, 1, 2, 5000))
        return [{"role": rng.choice(roles), "content": text(rng)} for _ in range(count)]
    if name in ("stop",):
        return [text(rng) for _ in range(rng.choice((1, 2, 17, 200)))]
    if name in ("stop_token_ids", "prompt"):
        return [rng.choice((0, 1, 642, 1023, 1024, 2**31, 2**32 - 1)) for _ in range(rng.choice((1, 3, 300)))]
    if name in ("max_tokens", "max_completion_tokens", "top_k", "logprobs", "top_logprobs", "seed", "n"):
        return rng.choice((-1, 0, 1, 2, 20, 21, 2**31 - 1, 2**32, 2**63, 2**64))
    if name in ("temperature", "top_p", "min_p", "timeout", "frequency_penalty"):
        return rng.choice((0, 0.001, 0.5, 1, 1.0000001, 2, 1e6, 1e7, -0.5, math.nan, math.inf))
    return text(rng)


def _dumps(rng: random.Random, body: object) -> bytes:
    """JSON as a client would send it; lone surrogates need ASCII escapes (``\\ud800``)."""
    try:
        return json.dumps(body, ensure_ascii=rng.random() < 0.5).encode()
    except UnicodeEncodeError:
        return json.dumps(body).encode()


def _broken(rng: random.Random, raw: bytes) -> bytes:
    """``raw`` made invalid: cut short, a byte flipped, invalid UTF-8, a BOM, or plain garbage."""
    shape = rng.randrange(5)
    if shape == 0:
        return raw[: rng.randrange(len(raw))]
    if shape == 1:
        at = rng.randrange(len(raw))
        return raw[:at] + bytes([rng.randrange(256)]) + raw[at + 1 :]
    if shape == 2:
        return raw.replace(b'"', b'"\xff\xfe', 1)
    if shape == 3:
        return b"\xef\xbb\xbf" + raw
    return bytes(rng.randrange(256) for _ in range(rng.randrange(64)))


def grpc_case(rng: random.Random) -> FuzzCase:
    """A ``Generate`` or ``Tokenize`` message with random fields, or bytes that are no message."""
    kind = rng.choice(("generate", "generate", "generate", "tokenize", "raw", "raw"))
    if kind == "tokenize":
        message = generation_pb2.TokenizeRequest(model=_pb_text(rng) if rng.random() < 0.2 else "")
        if rng.random() < 0.5:
            message.text = _pb_text(rng)
        else:
            message.chat.CopyFrom(_chat(rng))
        return FuzzCase("grpc", TOKENIZE, kind, message.SerializeToString())
    message = _generate_request(rng)
    if kind == "generate":
        return FuzzCase("grpc", GENERATE, kind, message.SerializeToString())
    method = rng.choice((GENERATE, GENERATE, TOKENIZE, LIST_MODELS))
    return FuzzCase("grpc", method, kind, _broken_pb(rng, message.SerializeToString()))


def _pb_text(rng: random.Random) -> str:
    """``text(rng)`` without lone surrogates, which a protobuf string cannot hold."""
    return text(rng).encode("utf-8", "replace").decode("utf-8")


def _chat(rng: random.Random) -> generation_pb2.Chat:
    roles = ("user", "system", "assistant", "tool", "bot", "")
    count = rng.choice((0, 1, 1, 2, 5000))
    messages = [
        generation_pb2.ChatMessage(role=rng.choice(roles), content=_pb_text(rng)) for _ in range(count)
    ]
    return generation_pb2.Chat(messages=messages, add_generation_prompt=rng.random() < 0.8)


def _generate_request(rng: random.Random) -> generation_pb2.GenerateRequest:
    """A valid short request, then a few fields set to random values of their protobuf types."""
    message = generation_pb2.GenerateRequest()
    message.token_ids.ids.extend([1, 2, 3])
    message.sampling.max_tokens = rng.randrange(1, 4)
    uint32 = (0, 1, 20, 21, 642, 1024, 2**31, 2**32 - 1)
    floats = (0.0, -0.0, 0.5, 1.0, 1.5, -1.0, 3e38, -3e38, 1e-45, math.inf, -math.inf, math.nan)
    for _ in range(rng.randrange(0, 4)):
        field = rng.randrange(12)
        if field == 0:
            message.request_id = _pb_text(rng)
        elif field == 1:
            setattr(message, rng.choice(("model", "session_id", "tenant")), _pb_text(rng))
        elif field == 2:
            message.text = _pb_text(rng)
        elif field == 3:
            message.chat.CopyFrom(_chat(rng))
        elif field == 4:
            message.token_ids.ids[:] = [rng.choice(uint32) for _ in range(rng.choice((0, 1, 5, 200, 5000)))]
        elif field in (5, 6):
            name = rng.choice(("max_tokens", "top_k", "logprobs"))
            setattr(message.sampling, name, rng.choice(uint32))
        elif field == 7:
            setattr(message.sampling, rng.choice(("temperature", "top_p", "min_p")), rng.choice(floats))
        elif field == 8:
            message.sampling.seed = rng.choice((0, 1, 2**63 - 1, 2**63, 2**64 - 1))
        elif field == 9:
            message.sampling.stop[:] = [_pb_text(rng) for _ in range(rng.choice((1, 3, 17, 100)))]
        elif field == 10:
            message.sampling.stop_token_ids[:] = [rng.choice(uint32) for _ in range(rng.choice((1, 300)))]
        else:
            message.sampling.ignore_eos = rng.random() < 0.5
    return message


def _broken_pb(rng: random.Random, raw: bytes) -> bytes:
    """Bytes that are not the message: garbage, cut short, a bad UTF-8 string (field 3, ``text``),
    a varint that never ends, a wrong wire type, or a length past the end."""
    shape = rng.randrange(6)
    if shape == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    if shape == 1:
        return raw[: rng.randrange(1, len(raw))] if len(raw) > 1 else b"\x1a"
    if shape == 2:
        return raw + b"\x1a\x02\xff\xfe"
    if shape == 3:
        return raw + b"\x08" + b"\xff" * rng.randrange(10, 20)
    if shape == 4:
        return b"\x1d" + raw  # field 3 as a fixed32 instead of a string
    return raw + b"\x1a" + bytes([0x80 | rng.randrange(128), 0x7F])
