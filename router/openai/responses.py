"""The router's ``GenerateResponse`` stream -> OpenAI response and chunk objects.

The gRPC API streams token ids and text deltas but has no per-token decode, so a token's string in
``logprobs`` is ``"token_id:<id>"`` (vLLM's ``return_tokens_as_token_ids`` convention) and chat
``bytes`` is null. In legacy completion logprobs, ``text_offset`` of a token is where the text of
the streamed message that carried it begins (exact when each message carries one token).
"""

from proto.baton.v1 import generation_pb2

_FINISH = {
    generation_pb2.FINISH_REASON_STOP: "stop",
    generation_pb2.FINISH_REASON_LENGTH: "length",
    generation_pb2.FINISH_REASON_ABORT: "abort",
}
_LOGPROB_FLOOR = -9999.0  # JSON has no -inf; vLLM clamps the same way


def token_name(token_id: int) -> str:
    return f"token_id:{token_id}"


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
    ):
        self.chat = chat
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

    def chunk(self, message: generation_pb2.GenerateResponse) -> dict:
        """Record one streamed message and return its SSE chunk (``delta`` / ``text`` since the last)."""
        first, self._chunks = self._chunks == 0, self._chunks + 1
        offset = len(self.text)
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
            choice = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": message.text}
        choice["logprobs"] = logprobs
        choice["finish_reason"] = self.finish_reason if message.finish_reason else None
        if self.return_token_ids:
            choice["token_ids"] = list(message.token_ids)
            if first and self.prompt_ids is not None:
                choice["prompt_token_ids"] = list(self.prompt_ids)
        return self._object("chat.completion.chunk" if self.chat else "text_completion", [choice])

    def usage_chunk(self) -> dict:
        """The chunk after the last one when ``stream_options.include_usage``: no choices, usage."""
        chunk = self._object("chat.completion.chunk" if self.chat else "text_completion", [])
        chunk["usage"] = self.usage
        return chunk

    def response(self) -> dict:
        """The whole (non-streamed) response, once every message went through ``chunk``."""
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": self.text}}
        else:
            choice = {"index": 0, "text": self.text}
        choice["logprobs"] = self._merged_logprobs()
        choice["finish_reason"] = self.finish_reason
        if self.return_token_ids:
            choice["token_ids"] = list(self.token_ids)
            if self.prompt_ids is not None:
                choice["prompt_token_ids"] = list(self.prompt_ids)
        response = self._object("chat.completion" if self.chat else "text_completion", [choice])
        response["usage"] = self.usage
        return response

    def _object(self, kind: str, choices: list) -> dict:
        return {**self.head, "object": kind, "choices": choices}

    def _logprobs_of(self, message, offset: int) -> dict | None:
        if self.logprobs is None:
            return None
        ids = list(message.token_ids)
        n = len(ids)  # the router sends one logprob per token (and one top list when asked)
        values = (list(message.logprobs) + [_LOGPROB_FLOOR] * n)[:n]
        tops = ([[(t.token_id, t.logprob) for t in top.top] for top in message.top_logprobs] + [[]] * n)[:n]
        if self.chat:
            part = {"content": [_chat_entry(t, v, top) for t, v, top in zip(ids, values, tops, strict=True)]}
        else:
            part = {
                "tokens": [token_name(t) for t in ids],
                "token_logprobs": [_logprob(v) for v in values],
                "top_logprobs": [
                    {token_name(t): _logprob(v), **{token_name(i): _logprob(p) for i, p in top}}
                    for t, v, top in zip(ids, values, tops, strict=True)
                ],
                "text_offset": [offset] * n,
            }
        self._logprob_parts.append(part)
        return part

    def _merged_logprobs(self) -> dict | None:
        if self.logprobs is None:
            return None
        merged: dict[str, list] = {}
        for part in self._logprob_parts:
            for key, values in part.items():
                merged.setdefault(key, []).extend(values)
        return merged or ({"content": []} if self.chat else _empty_legacy())


def _chat_entry(token_id: int, value: float, top: list[tuple[int, float]]) -> dict:
    return {
        "token": token_name(token_id),
        "logprob": _logprob(value),
        "bytes": None,
        "top_logprobs": [{"token": token_name(i), "logprob": _logprob(p), "bytes": None} for i, p in top],
    }


def _empty_legacy() -> dict:
    return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}


def _usage(usage: generation_pb2.Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "cached_tokens_host": usage.cached_tokens_host,
        },
    }
