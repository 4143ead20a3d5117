"""The synchronous client of Baton's public ``Generation`` API.

with Client("127.0.0.1:50051", timeout_s=60) as client:
    completion = client.generate("Hello", max_tokens=16)
    for chunk in client.generate_stream(prompt_ids=[1, 2, 3], max_tokens=8):
        print(chunk.text, end="")
"""

import time
from collections.abc import Iterator, Sequence

import grpc

from proto.baton.v1 import generation_pb2, generation_pb2_grpc

from .errors import from_rpc_error
from .request import auth_metadata, generate_request, requested_logprobs, tokenize_request
from .retry import DEFAULT_RETRY, Attempts, RetryPolicy
from .tls import PemSource, channel, client_tls
from .types import Completion, GenerationChunk, ModelInfo, chunk_from_pb, model_from_pb


class Client:
    """A connection to one router.

    Args:
        address: the router's ``HOST:PORT``.
        timeout_s: the default deadline of each call in seconds, retries and their waits included
            (None: no deadline); each method's ``timeout_s`` overrides it.
        retry: when failed calls are retried; see ``sdk.retry`` for the rule.
        channel_options: extra gRPC channel options, as ``(name, value)`` pairs.
        token: the bearer token a router with ``--auth-token-file`` needs, sent as the metadata
            ``authorization: Bearer <token>`` on every call (None: none sent).
        root_certificates, client_cert, client_key: TLS to a router with ``--tls-cert`` (and mutual
            TLS with ``--tls-client-ca``): a PEM path or bytes each (``sdk.tls.ClientTls``); any of
            them opens a secure channel (no ``root_certificates``: the system's roots). None of
            them: plaintext.

    Every failed call raises a ``sdk.errors.BatonError`` subclass. Close the client (or use it as
    a context manager) to release the channel.
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
        self._channel = channel(address, list(channel_options or ()), tls)
        self._stub = generation_pb2_grpc.GenerationStub(self._channel)

    def generate(self, prompt: str | None = None, *, timeout_s: float | None = None, **options) -> Completion:
        """Generate and wait for the whole result.

        Args:
            prompt: the prompt text; or give ``prompt_ids=`` or ``messages=`` instead.
            timeout_s: this call's deadline (default: the client's).
            **options: the keyword arguments of ``sdk.request.generate_request`` (``max_tokens``,
                ``temperature``, ``seed``, ``stop``, ``logprobs``, ``session_id``, ...).

        Returns:
            The ``Completion`` assembled from every streamed chunk.

        Raises:
            InvalidRequest: a bad argument, before anything is sent.
            BatonError: the call failed (after any retries ``sdk.retry`` allows).
        """
        request = generate_request(prompt, **options)
        chunks = self._stream(request, self._timeout(timeout_s))
        return Completion.from_chunks(chunks, logprobs=requested_logprobs(request))

    def generate_stream(
        self, prompt: str | None = None, *, timeout_s: float | None = None, **options
    ) -> Iterator[GenerationChunk]:
        """Generate, yielding each ``GenerationChunk`` as it arrives (arguments as ``generate``).

        The request is checked at once; the call starts here. Closing the iterator early
        (``.close()``, leaving a ``with contextlib.closing(...)`` block, or dropping it) cancels
        the call on the server. Retried only until the first chunk arrives (see ``sdk.retry``)."""
        request = generate_request(prompt, **options)
        return self._stream(request, self._timeout(timeout_s))

    def tokenize(
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
        return list(self._unary(self._stub.Tokenize, request, timeout_s).token_ids)

    def list_models(self, *, timeout_s: float | None = None) -> list[ModelInfo]:
        """The models this cluster serves."""
        response = self._unary(self._stub.ListModels, generation_pb2.ListModelsRequest(), timeout_s)
        return [model_from_pb(model) for model in response.models]

    def close(self) -> None:
        """Close the channel; calls still running are cancelled."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _timeout(self, timeout_s: float | None) -> float | None:
        return self.timeout_s if timeout_s is None else timeout_s

    def _stream(self, request, timeout_s: float | None) -> Iterator[GenerationChunk]:
        attempts = Attempts(self.retry, timeout_s)
        while True:
            call = self._stub.Generate(request, timeout=attempts.start(), metadata=self._metadata)
            received = False
            try:
                for message in call:
                    received = True
                    yield chunk_from_pb(message)
                return
            except grpc.RpcError as rpc_error:
                error = from_rpc_error(rpc_error)
                delay = attempts.retry_delay_s(error, received=received)
                if delay is None:
                    raise error from None
            finally:
                call.cancel()  # a no-op once finished; stops the server when the caller left early
            time.sleep(delay)

    def _unary(self, method, request, timeout_s: float | None):
        attempts = Attempts(self.retry, self._timeout(timeout_s))
        while True:
            try:
                return method(request, timeout=attempts.start(), metadata=self._metadata)
            except grpc.RpcError as rpc_error:
                error = from_rpc_error(rpc_error)
                delay = attempts.retry_delay_s(error, received=False)
                if delay is None:
                    raise error from None
            time.sleep(delay)
