"""The router's ``GenerateResponse`` streams -> OpenAI response and chunk objects.

One ``Transcript`` per choice (a request with several prompts or ``n > 1`` has several, each with
its ``index``); ``response`` and ``usage_chunk`` join them. A token in ``logprobs`` is named by its
piece of text (``TokenLabels``: the model's tokenizer, ``common/tokenizer/token_bytes.py``), chat
``bytes`` being the piece's raw bytes; with vLLM's ``return_tokens_as_token_ids`` (or a router
without a tokenizer) it is ``"token_id:<id>"``. In legacy completion logprobs, ``text_offset`` of a
token is where the text of the streamed message that carried it begins (exact when each message
carries one token), counted from the start of the choice's text.

``echo`` with ``logprobs`` (completions): the entries start with the prompt's tokens, from the first
message's ``prompt_token_ids`` / ``prompt_logprobs`` / ``prompt_top_logprobs``, as OpenAI's legacy API
and vLLM give them: the first prompt token's ``token_logprobs`` and ``top_logprobs`` are null (nothing
comes before it), and a prompt token's ``text_offset`` is where it starts in the echoed text
(``TokenLabels.text_offsets``: the prompt's ids decoded one by one; a text prompt's added special
tokens, such as a BOS, have no text there).
"""

from common.tokenizer import IncrementalDetokenizer, Tokenizer
from common.tokenizer.token_bytes import TokenBytes
from proto.baton.v1 import generation_pb2

_FINISH = {
    generation_pb2.FINISH_REASON_STOP: "stop",
    generation_pb2.FINISH_REASON_LENGTH: "length",
    generation_pb2.FINISH_REASON_ABORT: "abort",
    generation_pb2.FINISH_REASON_TOOL_CALLS: "tool_calls",
}
_LOGPROB_FLOOR = -9999.0  # JSON has no -inf; vLLM clamps the same way


def token_name(token_id: int) -> str:
    """vLLM's ``return_tokens_as_token_ids`` form of a token."""
    return f"token_id:{token_id}"


class TokenLabels:
    """How a response names tokens: their text and bytes from ``pieces``; ``token_id:<id>`` when
    ``as_ids`` (``bytes`` are then that name's, as vLLM sends them) or when there is no piece (no
    tokenizer, or an id of the model's vocabulary that its tokenizer lacks: ``bytes`` None).
    ``tokenizer`` (the one ``pieces`` come from) places an echoed prompt's tokens in its text."""

    def __init__(self, pieces: TokenBytes | None, as_ids: bool = False, tokenizer: Tokenizer | None = None):
        self.pieces = pieces
        self.as_ids = as_ids
        self.tokenizer = tokenizer

    def text_offsets(self, ids: list[int], skip_special_tokens: bool) -> list[int]:
        """Where each of ``ids`` starts in their decoded text (``Tokenizer.decode``, special tokens
        skipped or not): a token of no text (a skipped special token, the first half of a character)
        starts where the next text does. Without a tokenizer: the running length of the names."""
        offsets, at = [], 0
        if self.tokenizer is None:
            for token in ids:
                offsets.append(at)
                at += len(self.text(token))
            return offsets
        vocab = self.tokenizer.vocab_size  # the model's ids past the tokenizer's have no text
        detokenizer = IncrementalDetokenizer(self.tokenizer, skip_special_tokens=skip_special_tokens)
        for token in ids:
            offsets.append(at)
            at += len(detokenizer.push(token)) if token < vocab else 0
        return offsets

    def text(self, token_id: int) -> str:
        text = None if self.as_ids or self.pieces is None else self.pieces.text(token_id)
        return token_name(token_id) if text is None else text

    def bytes(self, token_id: int) -> list[int] | None:
        if self.as_ids:
            return list(token_name(token_id).encode())
        piece = None if self.pieces is None else self.pieces.piece(token_id)
        return None if piece is None else list(piece)


_ID_LABELS = TokenLabels(None)


def _logprob(value: float) -> float:
    return max(value, _LOGPROB_FLOOR) if value == value else _LOGPROB_FLOOR


class Transcript:
    """One request's output so far; turns each gRPC message into a chunk and builds the response.

    Args:
        chat: chat (``chat.completion``) or completions (``text_completion``) objects.
        response_id: ``id`` of the response and of every chunk.
        model: ``model`` to report.
        created: unix seconds.
        logprobs: None when the request asked for none, else the number of top alternatives.
        return_token_ids: add ``token_ids`` (and ``prompt_token_ids`` when given) to the choice.
        prompt_ids: the prompt's token ids when the client sent them.
        index: the choice's ``index`` (OpenAI's ``prompt_index * n + j``).
        labels: how log-prob entries name tokens (default: ``token_id:<id>``).
        echo: the prompt's text, written before the choice's text (completions' ``echo``), or None.
        echo_only: ``echo`` with ``max_tokens`` 0: the generated token is dropped (text, ids,
            log-probs, completion tokens) and the choice ends with ``length``.
        counts_prompt: whether ``response`` / ``usage_chunk`` count this choice's prompt tokens: one
            choice per prompt does, as OpenAI counts a prompt once whatever ``n``.
    """

    def __init__(
        self,
        chat: bool,
        response_id: str,
        model: str,
        created: int,
        logprobs: int | None,
        return_token_ids: bool,
        prompt_ids: tuple[int, ...] | None,
        *,
        index: int = 0,
        labels: TokenLabels = _ID_LABELS,
        echo: str | None = None,
        echo_only: bool = False,
        counts_prompt: bool = True,
    ):
        self.chat = chat
        self.index = index
        self.labels = labels
        self.echo = echo
        self.echo_only = echo_only
        self._prompt_part: dict | None = None  # the echoed prompt's log-probs, once they came
        self.counts_prompt = counts_prompt
        self.head = {"id": response_id, "object": "", "created": created, "model": model}
        self.logprobs = logprobs
        self.return_token_ids = return_token_ids
        self.prompt_ids = prompt_ids
        self.text = ""
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.usage: dict | None = None
        self._logprob_parts: list[dict] = []
        self._chunks = 0
        self.tool_calls: dict[int, dict] = {}  # index -> the call so far, in OpenAI's shape

    def chunk(self, message: generation_pb2.GenerateResponse) -> dict:
        """Record one streamed message and return its SSE chunk (``delta`` / ``text`` since the last)."""
        first, self._chunks = self._chunks == 0, self._chunks + 1
        self._take_prompt(message)
        if self.echo_only:
            message = _prompt_only(message)
        offset = len(self.echo or "") + len(self.text)
        self.text += message.text
        self.token_ids.extend(message.token_ids)
        logprobs = self._logprobs_of(message, offset)
        if message.finish_reason:
            self.finish_reason = _FINISH.get(message.finish_reason, "stop")
            self.usage = _usage(message.usage)
        if self.chat:
            delta = {"role": "assistant"} if first else {}
            if message.text or first:
                delta["content"] = message.text
            if message.tool_calls:
                delta["tool_calls"] = self._call_deltas(message.tool_calls)
            choice = {"index": self.index, "delta": delta}
        else:
            choice = {"index": self.index, "text": message.text}
        choice["logprobs"] = logprobs
        choice["finish_reason"] = self.finish_reason if message.finish_reason else None
        if self.return_token_ids:
            choice["token_ids"] = list(message.token_ids)
            if first and self.prompt_ids is not None:
                choice["prompt_token_ids"] = list(self.prompt_ids)
        return self._object("chat.completion.chunk" if self.chat else "text_completion", [choice])

    def echo_chunk(self, first: generation_pb2.GenerateResponse | None = None) -> dict:
        """The streamed chunk of ``echo``: the prompt's text, before the first generated one; with
        ``logprobs``, the prompt's log-probs too (from ``first``, the call's first message)."""
        if first is not None:
            self._take_prompt(first)
        logprobs = self._prompt_part if self.logprobs is not None else None
        choice = {"index": self.index, "text": self.echo or "", "logprobs": logprobs, "finish_reason": None}
        return self._object("text_completion", [choice])

    def usage_chunk(self) -> dict:
        """The chunk after the last one when ``stream_options.include_usage``: no choices, usage."""
        return usage_chunk([self])

    def response(self) -> dict:
        """The whole (non-streamed) response, once every message went through ``chunk``."""
        return response([self])

    def choice(self) -> dict:
        """This choice in the whole (non-streamed) response."""
        if self.chat:
            choice = {"index": self.index, "message": {"role": "assistant", "content": self.text}}
            if self.tool_calls:  # OpenAI's content is null beside calls when the model wrote none
                choice["message"]["content"] = self.text or None
                choice["message"]["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        else:
            choice = {"index": self.index, "text": (self.echo or "") + self.text}
        choice["logprobs"] = self._merged_logprobs()
        choice["finish_reason"] = self.finish_reason
        if self.return_token_ids:
            choice["token_ids"] = list(self.token_ids)
            if self.prompt_ids is not None:
                choice["prompt_token_ids"] = list(self.prompt_ids)
        return choice

    def _call_deltas(self, pieces) -> list[dict]:
        """A message's call pieces as ``delta.tool_calls`` entries (pieces of one call in a row joined),
        recorded into ``tool_calls``. A call's first entry has ``id``, ``type`` and ``function.name``."""
        entries: list[dict] = []
        for piece in pieces:
            call = self.tool_calls.get(piece.index)
            if call is None:
                call = {"id": piece.id, "type": "function", "function": {"name": piece.name, "arguments": ""}}
                self.tool_calls[piece.index] = call
                entries.append(
                    {"index": piece.index, **call, "function": {"name": piece.name, "arguments": ""}}
                )
            elif not entries or entries[-1]["index"] != piece.index:
                entries.append({"index": piece.index, "function": {"arguments": ""}})
            call["function"]["arguments"] += piece.arguments
            entries[-1]["function"]["arguments"] += piece.arguments
        return entries

    def _object(self, kind: str, choices: list) -> dict:
        return {**self.head, "object": kind, "choices": choices}

    def _logprobs_of(self, message, offset: int) -> dict | None:
        if self.logprobs is None:
            return None
        ids = list(message.token_ids)
        n = len(ids)  # the router sends one logprob per token (and one top list when asked)
        values, tops = _aligned(n, message.logprobs, message.top_logprobs)
        name = self.labels.text
        if self.chat:
            part = {
                "content": [self._chat_entry(t, v, top) for t, v, top in zip(ids, values, tops, strict=True)]
            }
        else:
            part = {
                "tokens": [name(t) for t in ids],
                "token_logprobs": [_logprob(v) for v in values],
                "top_logprobs": [
                    {name(t): _logprob(v), **{name(i): _logprob(p) for i, p in top}}
                    for t, v, top in zip(ids, values, tops, strict=True)
                ],
                "text_offset": [offset] * n,
            }
        self._logprob_parts.append(part)
        return part

    def _take_prompt(self, message) -> None:
        """Record the echoed prompt's log-probs from ``message``, once (the first message has them)."""
        if self._prompt_part is not None or self.echo is None or self.logprobs is None:
            return
        if not message.prompt_token_ids:
            return
        ids = list(message.prompt_token_ids)
        values, tops = _aligned(len(ids) - 1, message.prompt_logprobs, message.prompt_top_logprobs)
        name = self.labels.text
        # a text prompt's echo is the client's text (no added special tokens); token ids' their decoding
        offsets = self.labels.text_offsets(ids, skip_special_tokens=self.prompt_ids is None)
        self._prompt_part = {
            "tokens": [name(t) for t in ids],
            "token_logprobs": [None] + [_logprob(v) for v in values],
            "top_logprobs": [None]
            + [
                {name(t): _logprob(v), **{name(i): _logprob(p) for i, p in top}}
                for t, v, top in zip(ids[1:], values, tops, strict=True)
            ],
            "text_offset": [min(offset, len(self.echo)) for offset in offsets],
        }

    def _merged_logprobs(self) -> dict | None:
        if self.logprobs is None:
            return None
        merged: dict[str, list] = {}
        parts = [self._prompt_part] if self._prompt_part is not None else []
        for part in parts + self._logprob_parts:
            for key, values in part.items():
                merged.setdefault(key, []).extend(values)
        return merged or ({"content": []} if self.chat else _empty_legacy())

    def _chat_entry(self, token_id: int, value: float, top: list[tuple[int, float]]) -> dict:
        return {
            **self._chat_token(token_id, value),
            "top_logprobs": [self._chat_token(i, p) for i, p in top],
        }

    def _chat_token(self, token_id: int, value: float) -> dict:
        labels = self.labels
        return {"token": labels.text(token_id), "logprob": _logprob(value), "bytes": labels.bytes(token_id)}


def response(transcripts: list["Transcript"]) -> dict:
    """The whole (non-streamed) response of every choice, once each stream went through ``chunk``;
    ``usage`` summed over them (``_summed_usage``)."""
    first = transcripts[0]
    body = first._object(
        "chat.completion" if first.chat else "text_completion", [t.choice() for t in transcripts]
    )
    body["usage"] = _summed_usage(transcripts)
    return body


def usage_chunk(transcripts: list["Transcript"]) -> dict:
    """The chunk after the last one when ``stream_options.include_usage``: no choices, the summed usage."""
    first = transcripts[0]
    chunk = first._object("chat.completion.chunk" if first.chat else "text_completion", [])
    chunk["usage"] = _summed_usage(transcripts)
    return chunk


def _summed_usage(transcripts: list["Transcript"]) -> dict | None:
    """Completion tokens of every choice; prompt (and cached) tokens of the choices that count their
    prompt, one per prompt. None until every choice finished."""
    if any(t.usage is None for t in transcripts):
        return None
    total = {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0, "cached_tokens_host": 0}
    drafts = {"accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
    for t in transcripts:
        total["completion_tokens"] += t.usage["completion_tokens"]
        for key, value in t.usage.get("completion_tokens_details", {}).items():
            drafts[key] += value
        if t.counts_prompt:
            total["prompt_tokens"] += t.usage["prompt_tokens"]
            for key in ("cached_tokens", "cached_tokens_host"):
                total[key] += t.usage["prompt_tokens_details"][key]
    summed = {
        "prompt_tokens": total["prompt_tokens"],
        "completion_tokens": total["completion_tokens"],
        "total_tokens": total["prompt_tokens"] + total["completion_tokens"],
        "prompt_tokens_details": {
            "cached_tokens": total["cached_tokens"],
            "cached_tokens_host": total["cached_tokens_host"],
        },
    }
    if any("completion_tokens_details" in t.usage for t in transcripts):
        summed["completion_tokens_details"] = drafts
    return summed


def _aligned(n: int, logprobs, top_logprobs) -> tuple[list[float], list[list[tuple[int, float]]]]:
    """``n`` log-probs and ``n`` top lists from a message's repeated fields (padded when short)."""
    values = (list(logprobs) + [_LOGPROB_FLOOR] * n)[:n]
    tops = ([[(t.token_id, t.logprob) for t in top.top] for top in top_logprobs] + [[]] * n)[:n]
    return values, tops


def _prompt_only(message: generation_pb2.GenerateResponse) -> generation_pb2.GenerateResponse:
    """An ``echo_only`` choice's view of ``message``: nothing generated; the last one ends the choice
    with ``length`` (``max_tokens`` 0 reached) and counts no completion tokens."""
    kept = generation_pb2.GenerateResponse(request_id=message.request_id)
    if message.finish_reason:
        kept.finish_reason = generation_pb2.FINISH_REASON_LENGTH
        kept.usage.CopyFrom(message.usage)
        kept.usage.completion_tokens = 0
        kept.usage.draft_tokens = kept.usage.accepted_draft_tokens = 0
        kept.route.CopyFrom(message.route)
    return kept


def _empty_legacy() -> dict:
    return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}


def _usage(usage: generation_pb2.Usage) -> dict:
    """OpenAI's usage object; ``completion_tokens_details`` only where speculative decoding drafted for
    the request: its drafts accepted into the output and rejected, as OpenAI counts a prediction's."""
    body = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "cached_tokens_host": usage.cached_tokens_host,
        },
    }
    if usage.draft_tokens:
        body["completion_tokens_details"] = {
            "accepted_prediction_tokens": usage.accepted_draft_tokens,
            "rejected_prediction_tokens": usage.draft_tokens - usage.accepted_draft_tokens,
        }
    return body
