"""The aiohttp application: OpenAI routes over the router's gRPC ``Generation`` API, SSE streaming.

Routes: ``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health``, ``POST /v1/completions``,
``POST /v1/chat/completions``. Every error is an OpenAI error body (``errors.py``). A streamed
request answers with the first gRPC message, so refusals (400, 429, ...) keep their HTTP status;
an error after that is one ``data: {"error": ...}`` event, and the stream ends. When the client
goes away (or the front stops) the handler is cancelled and so are its gRPC calls, which frees the
requests at the router and the workers. A request with several choices (a batch of prompts, ``n``)
is one call per choice (``fanout.py``: a prompt's first sample first, its siblings on the cached prefix).

With an ``Authenticator`` every route but ``/health`` needs ``Authorization: Bearer`` (``auth.py``:
401 otherwise; 403 when a tenant-bound token comes with another ``tenant`` / ``X-Tenant``), and the
header goes on to the router's gRPC calls. ``/health`` asks the router's gRPC health service, which
needs no token.
"""

import asyncio
import logging
import time
import uuid

import grpc
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.tokenizer import Tokenizer
from common.tokenizer.token_bytes import TokenBytes
from proto.baton.v1 import generation_pb2, generation_pb2_grpc
from router.authentication import Authenticator, AuthRefused

from . import fanout
from .auth import auth_middleware, caller_of, grpc_metadata, unauthorized
from .body import MAX_BODY_BYTES, read_json_body
from .errors import error_body, from_request_error, from_rpc_error
from .fields import RequestError
from .responses import TokenLabels, Transcript, response
from .schema import DEFAULT_MAX_N, ChatRequest, CompletionRequest, parse_chat, parse_completion
from .translate import chat_calls, completion_calls

log = logging.getLogger(__name__)

_LIST_MODELS_TIMEOUT_S = 5.0
_SERVICE = "baton.v1.Generation"  # the health status /health reports


def build_app(
    channel: grpc.aio.Channel,
    authenticator: Authenticator | None = None,
    tokenizer: Tokenizer | None = None,
    max_n: int = DEFAULT_MAX_N,
) -> web.Application:
    """The application over a ``grpc.aio`` channel to the router (created on the serving loop);
    ``authenticator``: the bearer-token check (None: every request is let through, as before);
    ``tokenizer``: the model's, which names log-prob tokens by their text and decodes an echoed
    token-id prompt (None: tokens as ``token_id:<id>``, no echo of token ids); ``max_n``: the
    largest ``n`` accepted (the router's ``--max-n``)."""
    api = _Api(
        generation_pb2_grpc.GenerationStub(channel),
        health_pb2_grpc.HealthStub(channel),
        authenticator,
        tokenizer,
        max_n,
    )
    middlewares = [_errors] + ([auth_middleware(authenticator)] if authenticator is not None else [])
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=middlewares)
    app.router.add_get("/v1/models", api.models)
    app.router.add_get("/v1/models/{model}", api.model)
    app.router.add_get("/health", api.health)
    app.router.add_post("/v1/completions", api.completions)
    app.router.add_post("/v1/chat/completions", api.chat)
    app.on_shutdown.append(api.cancel_all)
    return app


class _Api:
    def __init__(
        self,
        stub: generation_pb2_grpc.GenerationStub,
        health_stub: health_pb2_grpc.HealthStub,
        authenticator: Authenticator | None,
        tokenizer: Tokenizer | None = None,
        max_n: int = DEFAULT_MAX_N,
    ):
        self.stub = stub
        self.health_stub = health_stub
        self.authenticator = authenticator
        self.tokenizer = tokenizer
        self.pieces = None if tokenizer is None else TokenBytes(tokenizer)
        self.max_n = max_n
        self.created = int(time.time())
        self.served: generation_pb2.ModelInfo | None = None  # ListModels' first model, once known
        self.inflight: set[asyncio.Task] = set()

    async def cancel_all(self, app: web.Application) -> None:
        """On shutdown: cancel every generation in flight (and with it its gRPC call)."""
        for task in list(self.inflight):
            task.cancel()

    async def health(self, request: web.Request) -> web.Response:
        check = health_pb2.HealthCheckRequest(service=_SERVICE)
        try:
            reply = await self.health_stub.Check(check, timeout=_LIST_MODELS_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            return _json(503, error_body(503, f"router: {error.details()}", code=error.code().name.lower()))
        if reply.status != health_pb2.HealthCheckResponse.SERVING:
            status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            return _json(503, error_body(503, f"router: {status}", code="unavailable"))
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        try:
            cards = await self._cards(request)
        except grpc.aio.AioRpcError as error:
            return _json(*from_rpc_error(error, chat=False))
        return web.json_response({"object": "list", "data": cards})

    async def model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        try:
            cards = await self._cards(request)
        except grpc.aio.AioRpcError as error:
            return _json(*from_rpc_error(error, chat=False))
        for card in cards:
            if card["id"] == name:
                return web.json_response(card)
        return _json(404, error_body(404, f"model: {name!r} is not served here", "model", "model_not_found"))

    async def _cards(self, request: web.Request) -> list[dict]:
        reply = await self.stub.ListModels(
            generation_pb2.ListModelsRequest(),
            timeout=_LIST_MODELS_TIMEOUT_S,
            metadata=grpc_metadata(request),
        )
        return [self._card(model) for model in reply.models]

    def _card(self, model: generation_pb2.ModelInfo) -> dict:
        return {
            "id": model.id,
            "object": "model",
            "created": self.created,
            "owned_by": "baton",
            "max_model_len": model.max_model_len,
            **({"parent": model.parent} if model.parent else {}),
        }

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        task = asyncio.current_task()
        self.inflight.add(task)
        try:
            try:
                body = await read_json_body(request)
                parsed = (parse_chat if chat else parse_completion)(body, request.headers, self.max_n)
                self._check_tenant(request, body, parsed.options.tenant)
                echoes = None if chat else self._echoes(parsed)
                served = await self._served(request)
            except AuthRefused as refused:
                return _json(403, error_body(403, refused.message, code="permission_denied"))
            except RequestError as error:
                return _json(*from_request_error(error))
            except grpc.aio.AioRpcError as error:
                return _json(*from_rpc_error(error, chat))
            request_id = uuid.uuid4().hex
            options = parsed.options
            if chat:
                messages = chat_calls(parsed, request_id, served.max_model_len)
            else:
                messages = completion_calls(parsed, request_id)
            response_id = f"{'chatcmpl' if chat else 'cmpl'}-{request_id}"
            transcripts = self._transcripts(parsed, response_id, served, echoes)
            metadata = grpc_metadata(request)
            _share_sessions(messages, options.n, request_id)
            calls: list = []
            try:
                replies, firsts = await fanout.open_calls(
                    calls,
                    lambda m: self.stub.Generate(m, timeout=options.timeout, metadata=metadata),
                    messages,
                    [i % options.n == 0 for i in range(len(messages))],
                )
                if options.stream:
                    return await fanout.stream(request, replies, firsts, transcripts, options.include_usage)
                await fanout.collect(replies, firsts, transcripts)
                return web.json_response(response(transcripts))
            except grpc.aio.AioRpcError as error:
                return _json(*from_rpc_error(error, chat))
            finally:
                for call in calls:
                    call.cancel()  # a no-op once the call finished; frees the request otherwise
        finally:
            self.inflight.discard(task)

    def _transcripts(
        self,
        parsed: CompletionRequest | ChatRequest,
        response_id: str,
        served: generation_pb2.ModelInfo,
        echoes: list[str] | None,
    ) -> list[Transcript]:
        """One transcript per choice, in ``index`` order (prompt-major for a batch); ``echoes``: each
        prompt's text when the request echoes them."""
        chat = isinstance(parsed, ChatRequest)
        options, created = parsed.options, int(time.time())
        labels = TokenLabels(self.pieces, options.return_tokens_as_token_ids, self.tokenizer)
        prompts = [None] if chat else parsed.prompts
        return [
            Transcript(
                chat,
                response_id,
                options.model or served.id,
                created,
                parsed.sampling.logprobs,
                options.return_token_ids,
                prompt if isinstance(prompt, tuple) else None,
                index=p * options.n + j,
                labels=labels,
                echo=None if echoes is None else echoes[p],
                echo_only=not chat and parsed.echo_only,
                counts_prompt=j == 0,
            )
            for p, prompt in enumerate(prompts)
            for j in range(options.n)
        ]

    def _echoes(self, parsed: CompletionRequest) -> list[str] | None:
        """With ``echo``, each prompt's text, in prompt order; token ids are decoded with the
        model's tokenizer (RequestError naming ``echo`` without one)."""
        if not parsed.echo:
            return None
        texts = []
        for prompt in parsed.prompts:
            if not isinstance(prompt, str):
                if self.tokenizer is None:
                    raise RequestError(
                        "echo", "echo: token-id prompts cannot be echoed: the router has no tokenizer"
                    )
                # An id outside the vocabulary is left out here: the router refuses the prompt naming it.
                vocab = self.tokenizer.vocab_size
                prompt = self.tokenizer.decode([t for t in prompt if t < vocab])
            texts.append(prompt)
        return texts

    def _check_tenant(self, request: web.Request, body: dict, asserted: str) -> None:
        """AuthRefused (403) when the token binds a tenant and the request asserts another; the
        message names where it did: the ``tenant`` field (which wins) or the ``X-Tenant`` header."""
        caller = caller_of(request)
        if caller is not None:
            self.authenticator.tenant(caller, asserted, "tenant" if "tenant" in body else "X-Tenant")

    async def _served(self, request: web.Request) -> generation_pb2.ModelInfo:
        if self.served is None:
            reply = await self.stub.ListModels(
                generation_pb2.ListModelsRequest(),
                timeout=_LIST_MODELS_TIMEOUT_S,
                metadata=grpc_metadata(request),
            )
            if not reply.models:
                raise RequestError("model", "model: the router serves no model")
            self.served = reply.models[0]
        return self.served


def _share_sessions(messages: list, n: int, request_id: str) -> None:
    """Give the ``n`` samples of each prompt (consecutive in ``messages``) one session id, the client's
    if it sent one: the router then sends the siblings where the first sample's prompt is cached."""
    for first in range(0, len(messages), n):
        session = messages[first].session_id or f"{request_id}-{first // n}"
        for message in messages[first : first + n]:
            message.session_id = session


def _json(status: int, body: dict) -> web.Response:
    if status == 401:  # the router refused the token (e.g. the file changed since the front's check)
        return unauthorized(body["error"]["message"])
    return web.json_response(body, status=status)


@web.middleware
async def _errors(request: web.Request, handler) -> web.StreamResponse:
    """Unknown routes and unexpected failures still answer with an OpenAI error body."""
    try:
        return await handler(request)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        message = f"{request.method} {request.path}: {error.reason}"
        return _json(error.status, error_body(error.status, message))
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return _json(500, error_body(500, "internal error; see the router's log"))
