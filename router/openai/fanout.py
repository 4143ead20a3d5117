"""A request's choices as concurrent gRPC ``Generate`` calls: collected whole, or streamed as SSE.

Every choice (each prompt of a batch, each of ``n`` samples) is its own call to the router
(``open_calls``): the first sample of every prompt is sent first, and the other ``n - 1`` once it has
sent its first message, i.e. once its prompt is prefilled and in the workers' prefix cache; they carry
its session id, so the router sends them to the same workers, where only the prompt's last partial block
is computed again. One prefill, ``n`` decodes, at the cost of the siblings' first token waiting for the
first sample's. Each sample is still its own request at the router (admission, rate limits).

Streamed, the first message of every call is awaited before the response starts, so a refusal of
any of them (400, 429, ...) keeps its HTTP status; after that the choices' chunks interleave as they
arrive, each with its ``index``, and one ``[DONE]`` ends the stream. An error after the start is one
``data: {"error": ...}`` event, and the stream ends. The caller cancels every call when the handler
ends (done, failed, or cancelled because the client went away), which frees the requests at the
router and the workers; the tasks reading them here are cancelled and awaited on every path.
"""

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
from aiohttp import web

from .errors import from_rpc_error
from .responses import Transcript, usage_chunk

_QUEUED_PER_CALL = 4  # messages read ahead per call while the client is slower than the workers
_END = object()


async def open_calls(
    calls: list, start: Callable[[Any], Any], messages: Sequence, leaders: Sequence[bool]
) -> tuple[list, list]:
    """Start a call per message (``start(message)``, each appended to ``calls`` as it starts, so the
    caller can cancel them on any path): the ``leaders`` first, the others once every leader has sent its
    first message. Returns each call's reply iterator and first message (None: it ended without one).
    Raises the first refusal's ``AioRpcError``."""
    replies: list = [None] * len(messages)
    firsts: list = [None] * len(messages)
    for wave in (True, False):
        chosen = [i for i, leader in enumerate(leaders) if leader is wave]
        for i in chosen:
            call = start(messages[i])
            calls.append(call)
            replies[i] = call.__aiter__()
        for i, first in zip(chosen, await _together([anext(replies[i], None) for i in chosen]), strict=True):
            firsts[i] = first
    return replies, firsts


async def collect(replies: Sequence, firsts: Sequence, transcripts: Sequence[Transcript]) -> None:
    """Read every call to its end into its transcript (``open_calls``' replies and first messages).
    Raises the first call's ``AioRpcError``."""

    async def read(reply_iterator, first, transcript: Transcript) -> None:
        if first is None:
            return
        transcript.chunk(first)
        async for reply in reply_iterator:
            transcript.chunk(reply)

    await _together([read(*choice) for choice in zip(replies, firsts, transcripts, strict=True)])


async def stream(
    request: web.Request,
    replies: Sequence,
    firsts: Sequence,
    transcripts: Sequence[Transcript],
    include_usage: bool,
) -> web.StreamResponse:
    """The SSE response of every call (``open_calls``' replies and first messages, read before the
    response starts so that refusals keep their status): ``echo`` chunks first (with the prompt's
    log-probs when asked), then chunks as the calls send them."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    queue: asyncio.Queue = asyncio.Queue(maxsize=_QUEUED_PER_CALL * len(replies))
    live = [i for i, first in enumerate(firsts) if first is not None]  # the others already ended
    pumps = [asyncio.ensure_future(_pump(i, replies[i], queue)) for i in live]
    try:
        try:
            for transcript, first in zip(transcripts, firsts, strict=True):
                if (
                    transcript.echo is not None
                ):  # with the prompt's log-probs, which came in the first message
                    await _event(response, transcript.echo_chunk(first))
            for transcript, first in zip(transcripts, firsts, strict=True):
                if first is not None:
                    await _event(response, transcript.chunk(first))
            running = len(live)
            while running:
                i, item = await queue.get()
                if item is _END:
                    running -= 1
                elif isinstance(item, grpc.aio.AioRpcError):
                    raise item
                else:
                    await _event(response, transcripts[i].chunk(item))
            if include_usage and all(t.usage is not None for t in transcripts):
                await _event(response, usage_chunk(list(transcripts)))
            await response.write(b"data: [DONE]\n\n")
        except grpc.aio.AioRpcError as error:
            await _event(response, from_rpc_error(error, transcripts[0].chat)[1])
        await response.write_eof()
    except ConnectionResetError:
        pass  # the client went away, mid-stream or once it had [DONE]; the caller cancels the calls
    finally:
        await _cancel(pumps)
    return response


async def _pump(i: int, replies, queue: asyncio.Queue) -> None:
    """Call ``i``'s messages after its first into ``queue``, then ``_END`` (or the call's error)."""
    try:
        while (reply := await anext(replies, None)) is not None:
            await queue.put((i, reply))
        await queue.put((i, _END))
    except grpc.aio.AioRpcError as error:
        await queue.put((i, error))


async def _together(awaitables: list[Awaitable]) -> list:
    """Await all; on the first failure (or a cancellation) cancel and await the rest, then raise."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return await asyncio.gather(*tasks)
    finally:
        await _cancel(tasks)


async def _cancel(tasks: list[asyncio.Future]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _event(response: web.StreamResponse, data: dict) -> None:
    await response.write(b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n")
