"""The asyncio client (``grpc.aio``): the same surface as ``sdk.client.Client``, awaited.

    async with AsyncClient("127.0.0.1:50051", timeout_s=60) as client:
        completion = await client.generate("Hello", max_tokens=16)
        async for chunk in client.generate_stream(prompt_ids=[1, 2, 3], max_tokens=8):
            print(chunk.text, end="")

Request building, protobuf conversion and the retry rule are shared with the sync client.
"""

import asyncio
from collections.abc import AsyncIterator, Sequence

import grpc
import grpc.aio

from proto.baton.v1 import generation_pb2, generation_pb2_grpc

from .errors import from_rpc_error
from .request import auth_metadata, generate_request, requested_logprobs, tokenize_request
from .retry import DEFAULT_RETRY, Attempts, RetryPolicy
from .tls import PemSource, channel, client_tls
from .types import Completion, GenerationChunk, ModelInfo, chunk_from_pb, model_from_pb


class AsyncClient:
    """A ``grpc.aio`` connection to one router; create it inside the event loop that uses it.

    Args: as ``sdk.client.Client`` (``address``, ``timeout_s``, ``retry``, ``channel_options``, ``token``,
    ``root_certificates``, ``client_cert``, ``client_key``).
    Every failed call raises a ``sdk.errors.BatonError`` subclass. ``await client.close()`` (or use
    ``async with``) to release the channel.
    """

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        channel_options: Sequence[tuple[str, object]] | None = None,
        token: str | None = None,
        root_certificates: PemSource | None = None,
        client_cert: PemSource | None = None,
        client_key: PemSource | None = None,
    ):
        self.address = address
        self._metadata = auth_metadata(token)
        self.timeout_s = timeout_s
        self.retry = retry
        tls = client_tls(root_certificates, client_cert, client_key)
        self._channel = channel(address, list(channel_options or ()), tls, aio=True)
        self._stub = generation_pb2_grpc.GenerationStub(self._channel)

    async def generate(
        self, prompt: str | None = None, *, timeout_s: float | None = None, **options
    ) -> Completion:
        """Generate and wait for the whole result; arguments, result and errors as
        ``Client.generate``."""
        request = generate_request(prompt, **options)
        stream = self._stream(request, self._timeout(timeout_s))
        try:
            chunks = [chunk async for chunk in stream]
        finally:
            await stream.aclose()
        return Completion.from_chunks(chunks, logprobs=requested_logprobs(request))

    def generate_stream(
        self, prompt: str | None = None, *, timeout_s: float | None = None, **options
    ) -> AsyncIterator[GenerationChunk]:
        """An async iterator of ``GenerationChunk`` as they arrive (arguments as ``generate``).

        The request is checked at once. ``await iterator.aclose()`` (or ``contextlib.aclosing``)
        before the end cancels the call on the server. Retried only until the first chunk
        arrives (see ``sdk.retry``)."""
        request = generate_request(prompt, **options)
        return self._stream(request, self._timeout(timeout_s))

    async def tokenize(
        self,
        text: str | None = None,
        *,
        messages: list[dict] | None = None,
        add_generation_prompt: bool = True,
        model: str = "",
        timeout_s: float | None = None,
    ) -> list[int]:
        """Token ids of ``text``, or of ``messages`` rendered with the model's chat template."""
        request = tokenize_request(
            text, messages=messages, add_generation_prompt=add_generation_prompt, model=model
        )
        return list((await self._unary(self._stub.Tokenize, request, timeout_s)).token_ids)

    async def list_models(self, *, timeout_s: float | None = None) -> list[ModelInfo]:
        """The models this cluster serves."""
        response = await self._unary(self._stub.ListModels, generation_pb2.ListModelsRequest(), timeout_s)
        return [model_from_pb(model) for model in response.models]

    async def close(self) -> None:
        """Close the channel; calls still running are cancelled."""
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    def _timeout(self, timeout_s: float | None) -> float | None:
        return self.timeout_s if timeout_s is None else timeout_s

    async def _stream(self, request, timeout_s: float | None) -> AsyncIterator[GenerationChunk]:
        attempts = Attempts(self.retry, timeout_s)
        while True:
            call = self._stub.Generate(request, timeout=attempts.start(), metadata=self._metadata)
            received = False
            try:
                async for message in call:
                    received = True
                    yield chunk_from_pb(message)
                return
            except grpc.RpcError as rpc_error:  # grpc.aio.AioRpcError is one
                error = from_rpc_error(rpc_error)
                delay = attempts.retry_delay_s(error, received=received)
                if delay is None:
                    raise error from None
            finally:
                call.cancel()  # a no-op once finished; stops the server when the caller left early
            await asyncio.sleep(delay)

    async def _unary(self, method, request, timeout_s: float | None):
        attempts = Attempts(self.retry, self._timeout(timeout_s))
        while True:
            try:
                return await method(request, timeout=attempts.start(), metadata=self._metadata)
            except grpc.RpcError as rpc_error:
                error = from_rpc_error(rpc_error)
                delay = attempts.retry_delay_s(error, received=False)
                if delay is None:
                    raise error from None
            await asyncio.sleep(delay)
