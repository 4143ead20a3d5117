"""The OpenAI HTTP client: streamed ``POST /v1/completions`` with token-id prompts, parsed as SSE.

Works against Baton's front and against vLLM / SGLang (``ignore_eos`` and ``return_token_ids`` are
their extensions; servers that do not know ``return_token_ids`` ignore it). Tokens per streamed
chunk: ``len(choice.token_ids)`` when the server sends them, else one per chunk carrying text; the
final ``usage.completion_tokens`` then corrects the count (missing tokens take the last arrival
time, extra ones are dropped). Cached tokens come from ``usage.prompt_tokens_details.cached_tokens``.
"""

import asyncio
import json

import aiohttp
import grpc

from loadtest.records import RequestRecord
from sdk.tls import ClientTls

from .base import Client, Stamper, one_line

# HTTP status -> gRPC code name, so records read the same whichever client produced them.
_CODES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    413: "INVALID_ARGUMENT",
    422: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_GRPC_NAMES = {code.name for code in grpc.StatusCode}


class HttpClient(Client):
    """Streams completions from one OpenAI-compatible server.

    Args:
        base_url: ``http://HOST:PORT`` (``/v1/completions`` is appended).
        model: the ``model`` field; None leaves it out (Baton's front serves its only model).
        timeout_s: limit on each whole request (DEADLINE_EXCEEDED when passed).
        token: sent as ``Authorization: Bearer <token>`` (None: no header).
        tls: HTTPS with this CA (and client certificate): ``http://`` in ``base_url`` becomes
            ``https://`` (None: as given).
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        timeout_s: float | None = 600.0,
        token: str | None = None,
        tls: ClientTls | None = None,
    ):
        if tls is not None and base_url.startswith("http://"):
            base_url = "https://" + base_url.removeprefix("http://")
        self.url = base_url.rstrip("/") + "/v1/completions"
        self._auth = {"Authorization": f"Bearer {token}"} if token is not None else {}
        self.model = model
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        # No connection limit: the driver decides how many requests are in flight.
        ssl_context = True if tls is None else tls.ssl_context()  # True: aiohttp's default checks
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, ssl=ssl_context))

    async def generate(
        self, prompt_ids: tuple[int, ...], max_tokens: int, session_id: str, record: RequestRecord
    ) -> None:
        stamp = Stamper(record)
        body = {
            "prompt": list(prompt_ids),
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
        if self.model is not None:
            body["model"] = self.model
        headers = {**self._auth, **({"x-session-id": session_id} if session_id else {})}
        try:
            post = self._session.post(self.url, json=body, headers=headers, timeout=self.timeout)
            async with post as reply:
                if reply.status != 200:
                    record.error = _error(reply.status, await reply.text())
                else:
                    await _read_stream(reply, record, stamp)
        except asyncio.TimeoutError:
            record.error = "DEADLINE_EXCEEDED: the request took longer than its timeout"
        except aiohttp.ClientError as error:
            record.error = f"UNAVAILABLE: {one_line(f'{type(error).__name__}: {error}')}"
        record.end_s = stamp.now()

    async def close(self) -> None:
        await self._session.close()


async def _read_stream(reply: aiohttp.ClientResponse, record: RequestRecord, stamp: Stamper) -> None:
    try:
        record.error = await _read_chunks(reply, record, stamp)
    finally:
        record.output_tokens = len(record.token_times_s)


async def _read_chunks(reply: aiohttp.ClientResponse, record: RequestRecord, stamp: Stamper) -> str | None:
    """Fill ``record`` from the stream; returns the error, if any."""
    usage, finished = None, False
    async for payload in _events(reply):
        if payload == "[DONE]":
            finished = True
            break
        try:
            chunk = json.loads(payload)
        except ValueError:
            return f"INTERNAL: not JSON in the stream: {one_line(payload, 120)}"
        if "error" in chunk:
            return _error(500, payload)
        now = stamp.now()
        for choice in chunk.get("choices") or ():
            ids = choice.get("token_ids")
            count = len(ids) if isinstance(ids, list) else int(bool(choice.get("text")))
            record.token_times_s.extend([now] * count)
            finished = finished or choice.get("finish_reason") is not None
        usage = chunk.get("usage") or usage
    if usage is not None:
        details = usage.get("prompt_tokens_details") or {}
        record.cached_tokens = int(details.get("cached_tokens") or 0)
        record.cached_tokens_host = int(details.get("cached_tokens_host") or 0)
        times, want = record.token_times_s, int(usage.get("completion_tokens") or 0)
        del times[want:]
        times.extend([times[-1] if times else stamp.now()] * (want - len(times)))
    if not (finished or usage):
        return "UNAVAILABLE: the stream ended before its last chunk"
    return None


async def _events(reply: aiohttp.ClientResponse):
    """The ``data`` payloads of a server-sent event stream (multi-line data joined by newlines)."""
    data: list[str] = []
    async for raw in reply.content:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield "\n".join(data)


def _error(status: int, text: str) -> str:
    """``CODE: message`` from an OpenAI error body (``code`` wins when it names a gRPC status)."""
    message, code = text, None
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict):
        message = str(error.get("message") or text)
        code = error.get("code")
        if isinstance(code, int):
            status, code = code, None
    name = str(code).upper() if code is not None else ""
    if name not in _GRPC_NAMES:
        name = _CODES.get(status, "UNKNOWN")
    return f"{name}: {one_line(message)}"
