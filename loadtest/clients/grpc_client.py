"""The gRPC client: the router's ``baton.v1.Generation`` through the project SDK (``sdk.AsyncClient``)."""

import contextlib

from loadtest.records import RequestRecord
from sdk import AsyncClient, BatonError
from sdk.retry import RetryPolicy
from sdk.tls import ClientTls

from .base import Client, Stamper, one_line

# A load test measures what the server does: a refusal is an error to count, not a call to retry.
NO_RETRY = RetryPolicy(max_attempts=1)


class GrpcClient(Client):
    """Streams ``Generate`` calls to one router.

    Args:
        address: the router's ``HOST:PORT``.
        timeout_s: deadline of each call (DEADLINE_EXCEEDED when passed).
        token: the router's bearer token (None: none sent).
        tls: the channel's TLS (None: plaintext).
    """

    def __init__(
        self,
        address: str,
        timeout_s: float | None = 600.0,
        token: str | None = None,
        tls: ClientTls | None = None,
    ):
        secure = {} if tls is None else vars(tls)  # root_certificates, client_cert, client_key
        self._sdk = AsyncClient(address, timeout_s=timeout_s, retry=NO_RETRY, token=token, **secure)

    async def generate(
        self, prompt_ids: tuple[int, ...], max_tokens: int, session_id: str, record: RequestRecord
    ) -> None:
        stamp = Stamper(record)
        try:
            stream = self._sdk.generate_stream(
                prompt_ids=list(prompt_ids),
                max_tokens=max_tokens,
                ignore_eos=True,
                session_id=session_id,
                temperature=0,
            )
            async with contextlib.aclosing(stream):  # closing early cancels the call on the server
                async for chunk in stream:
                    now = stamp.now()
                    record.token_times_s.extend([now] * len(chunk.token_ids))
                    record.output_tokens += len(chunk.token_ids)
                    if chunk.usage is not None:
                        record.cached_tokens = chunk.usage.cached_tokens
                        record.cached_tokens_host = chunk.usage.cached_tokens_host
        except BatonError as error:
            record.error = f"{error.code.name}: {one_line(error.details)}"
        except Exception as error:  # a client-side failure still ends only this request
            record.error = f"INTERNAL: {one_line(f'{type(error).__name__}: {error}')}"
        record.end_s = stamp.now()

    async def close(self) -> None:
        await self._sdk.close()
