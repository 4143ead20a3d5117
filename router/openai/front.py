"""``OpenAIFront``: the OpenAI HTTP application on its own thread and asyncio event loop."""

import asyncio
import ssl
import threading

import grpc
from aiohttp import web

from common.tokenizer import Tokenizer
from router.authentication import Authenticator

from .app import build_app
from .schema import DEFAULT_MAX_N

_START_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 10.0
_SHUTDOWN_GRACE_S = 1.0  # handlers left after cancellation get this long before they are dropped


class OpenAIFront:
    """Serves the OpenAI-compatible HTTP API, calling the router's gRPC API at ``grpc_target``.

    ``authenticator``: the bearer-token check of every route but ``/health`` (None: none).
    ``tokenizer``: the model's (log-prob tokens by their text, ``echo`` of token ids; None: neither).
    ``max_n``: the largest ``n`` a request may ask for (``RouterConfig.max_n``).
    ``ssl_context``: serve HTTPS with it (``router/tls.py``; None: plain HTTP). ``grpc_target`` is
    always reached in plaintext: loopback, or the router's private Unix socket when it has TLS.
    Serving starts in the constructor (``port`` 0 picks a free port; ``.port`` is the bound one)
    and runs on a daemon thread with its own event loop, so it never blocks the caller.
    ``stop()`` cancels the generations in flight, closes the listener and the gRPC channel, and
    joins the thread.

    Raises:
        ValueError: naming ``http_port`` when the address cannot be bound.
    """

    def __init__(
        self,
        grpc_target: str,
        host: str = "127.0.0.1",
        port: int = 0,
        authenticator: Authenticator | None = None,
        ssl_context: ssl.SSLContext | None = None,
        tokenizer: Tokenizer | None = None,
        max_n: int = DEFAULT_MAX_N,
    ):
        self.authenticator = authenticator
        self.tokenizer = tokenizer
        self.max_n = max_n
        self.ssl_context = ssl_context
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="openai-front", daemon=True)
        self._thread.start()
        self._runner: web.AppRunner | None = None
        self._channel: grpc.aio.Channel | None = None
        try:
            self.port = self._call(self._start(grpc_target, host, port), _START_TIMEOUT_S)
        except BaseException as error:
            self._close()
            if isinstance(error, OSError):
                raise ValueError(f"http_port: cannot listen on {host}:{port} ({error})") from None
            raise

    def stop(self) -> None:
        """Stop serving and join the thread; idempotent."""
        if not self._loop.is_closed():
            self._close()

    def _call(self, coroutine, timeout_s: float):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)

    async def _start(self, grpc_target: str, host: str, port: int) -> int:
        self._channel = grpc.aio.insecure_channel(grpc_target)
        # handler_cancellation: a client that disconnects cancels its handler, hence its gRPC call.
        self._runner = web.AppRunner(
            build_app(self._channel, self.authenticator, self.tokenizer, self.max_n),
            handler_cancellation=True,
            shutdown_timeout=_SHUTDOWN_GRACE_S,
            access_log=None,
        )
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port, ssl_context=self.ssl_context).start()
        return self._runner.addresses[0][1]

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()  # stops listening, cancels in-flight handlers (on_shutdown)
        if self._channel is not None:
            await self._channel.close()
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        await self._loop.shutdown_asyncgens()

    def _close(self) -> None:
        try:
            self._call(self._shutdown(), _STOP_TIMEOUT_S)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
