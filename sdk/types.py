"""Result types (frozen dataclasses) and the one place protobuf responses become them.

Sequences are tuples so results stay immutable; ``top_logprobs`` holds, per token, a tuple of
``(token_id, logprob)`` pairs.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from proto.baton.v1 import generation_pb2

TopLogprobs = tuple[tuple[tuple[int, float], ...], ...]

_REASONS = {
    generation_pb2.FINISH_REASON_STOP: "stop",
    generation_pb2.FINISH_REASON_LENGTH: "length",
    generation_pb2.FINISH_REASON_ABORT: "abort",
    generation_pb2.FINISH_REASON_TOOL_CALLS: "tool_calls",
}


@dataclass(frozen=True)
class ToolCall:
    """A call parsed from a chat's output: ``id`` (the model's, or ``call_<hex>``), the function's
    ``name`` and its ``arguments`` as the JSON text the model wrote."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A streamed piece of call ``index``: ``id`` and ``name`` on its first piece only, then pieces
    of ``arguments`` (joined in order, they are the call's)."""

    index: int
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Usage:
    """Token counts of one request; ``cached_tokens`` of the prompt came from the prefix cache,
    ``cached_tokens_host`` of those from a worker's host tier (HiCache) rather than its GPU pool;
    ``draft_tokens`` the speculative drafts the decode worker verified, ``accepted_draft_tokens`` of
    those accepted into the output (0 and 0 without speculative decoding)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cached_tokens_host: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0


@dataclass(frozen=True)
class Route:
    """Where a request ran. ``prefill_worker`` is empty when decode prefilled locally;
    ``transfer_backend`` (``nixl``, ``grpc_bytes``) is empty without a handoff."""

    prefill_worker: str
    decode_worker: str
    transfer_backend: str
    transfer_bytes: int


@dataclass(frozen=True)
class PromptLogprobs:
    """A prompt's scores: ``token_ids`` the prompt as the server tokenized it; ``logprobs[i]`` the
    log-prob of ``token_ids[i + 1]`` given the tokens before it; ``top_logprobs[i]`` its top
    ``(token id, logprob)`` alternatives (empty tuples when none were asked for)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_logprobs: TopLogprobs


@dataclass(frozen=True)
class GenerationChunk:
    """One streamed message: the tokens and text new since the previous chunk.

    ``logprobs`` has one entry per new token when logprobs were requested (else empty);
    ``top_logprobs`` one entry per new token when ``logprobs=n > 0``. ``finish_reason``
    (``"stop"``, ``"length"``, ``"abort"`` or ``"tool_calls"``; ``"unknown"`` for a reason newer
    than this SDK), ``usage`` and ``route`` are set on the last chunk only, and ``None`` before it.
    ``tool_calls``: a chat with tools, pieces of the calls parsed from the output (their markup is
    then not in ``text``). ``prompt_logprobs``: with ``prompt_logprobs`` requested, on the first chunk
    only (else None)."""

    request_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_logprobs: TopLogprobs
    text: str
    finish_reason: str | None = None
    usage: Usage | None = None
    route: Route | None = None
    tool_calls: tuple[ToolCallDelta, ...] = ()
    prompt_logprobs: PromptLogprobs | None = None


@dataclass(frozen=True)
class Completion:
    """A whole generation, assembled from its chunks.

    ``logprobs`` is ``None`` unless requested; ``top_logprobs`` is ``None`` unless ``logprobs=n``
    with ``n > 0`` was requested. ``finish_reason``, ``usage`` and ``route`` come from the last
    chunk (``None`` if the stream ended without one). ``tool_calls``: the calls parsed from a chat's
    output, their pieces joined. ``prompt_logprobs``: the prompt's scores, when requested."""

    request_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None
    top_logprobs: TopLogprobs | None
    text: str
    finish_reason: str | None
    usage: Usage | None
    route: Route | None
    tool_calls: tuple[ToolCall, ...] = ()
    prompt_logprobs: PromptLogprobs | None = None

    @classmethod
    def from_chunks(cls, chunks: Iterable[GenerationChunk], *, logprobs: int | None = None) -> "Completion":
        """Concatenate ``chunks`` in order. ``logprobs`` is the request's setting (None, 0 or n)."""
        request_id, tokens, values, tops, text, last, scored = "", [], [], [], [], None, None
        calls: dict[int, list[str]] = {}
        for chunk in chunks:
            for piece in chunk.tool_calls:
                calls.setdefault(piece.index, [piece.id, piece.name, ""])[2] += piece.arguments
            request_id = request_id or chunk.request_id
            scored = scored or chunk.prompt_logprobs
            tokens += chunk.token_ids
            values += chunk.logprobs
            tops += chunk.top_logprobs
            text.append(chunk.text)
            last = chunk
        return cls(
            request_id=request_id,
            token_ids=tuple(tokens),
            logprobs=tuple(values) if logprobs is not None else None,
            top_logprobs=tuple(tops) if logprobs else None,
            text="".join(text),
            finish_reason=last.finish_reason if last else None,
            usage=last.usage if last else None,
            route=last.route if last else None,
            tool_calls=tuple(ToolCall(*calls[i]) for i in sorted(calls)),
            prompt_logprobs=scored,
        )


@dataclass(frozen=True)
class ModelInfo:
    """A served model: its id (what ``model=`` takes), family and longest prompt + completion."""

    id: str
    family: str
    max_model_len: int


def chunk_from_pb(message: generation_pb2.GenerateResponse) -> GenerationChunk:
    """One ``GenerateResponse`` as a chunk; usage and route only when it carries a finish reason."""
    final = message.finish_reason != generation_pb2.FINISH_REASON_UNSPECIFIED
    return GenerationChunk(
        request_id=message.request_id,
        token_ids=tuple(message.token_ids),
        logprobs=tuple(message.logprobs),
        top_logprobs=tuple(
            tuple((top.token_id, top.logprob) for top in token.top) for token in message.top_logprobs
        ),
        text=message.text,
        finish_reason=_REASONS.get(message.finish_reason, "unknown") if final else None,
        usage=_usage_from_pb(message.usage) if final else None,
        route=_route_from_pb(message.route) if final else None,
        tool_calls=tuple(ToolCallDelta(c.index, c.id, c.name, c.arguments) for c in message.tool_calls),
        prompt_logprobs=_prompt_logprobs_from_pb(message) if message.prompt_token_ids else None,
    )


def _prompt_logprobs_from_pb(message: generation_pb2.GenerateResponse) -> PromptLogprobs:
    return PromptLogprobs(
        token_ids=tuple(message.prompt_token_ids),
        logprobs=tuple(message.prompt_logprobs),
        top_logprobs=tuple(
            tuple((top.token_id, top.logprob) for top in token.top) for token in message.prompt_top_logprobs
        ),
    )


def model_from_pb(model: generation_pb2.ModelInfo) -> ModelInfo:
    """One ``ModelInfo`` message as the dataclass."""
    return ModelInfo(id=model.id, family=model.family, max_model_len=model.max_model_len)


def _usage_from_pb(usage: generation_pb2.Usage) -> Usage:
    return Usage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        cached_tokens=usage.cached_tokens,
        cached_tokens_host=usage.cached_tokens_host,
        draft_tokens=usage.draft_tokens,
        accepted_draft_tokens=usage.accepted_draft_tokens,
    )


def _route_from_pb(route: generation_pb2.Route) -> Route:
    return Route(
        prefill_worker=route.prefill_worker,
        decode_worker=route.decode_worker,
        transfer_backend=route.transfer_backend,
        transfer_bytes=route.transfer_bytes,
    )
