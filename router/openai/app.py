"""The aiohttp application: OpenAI routes over the router's gRPC ``Generation`` API, SSE streaming.

Routes: ``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health``, ``POST /v1/completions``,
``POST /v1/chat/completions``. Every error is an OpenAI error body (``errors.py``). A streamed
request answers with the first gRPC message, so refusals (400, 429, ...) keep their HTTP status;
an error after that is one ``data: {"error": ...}`` event, and the stream ends. When the client
goes away (or the front stops) the handler is cancelled and so is its gRPC call, which frees the
request at the router and the workers.

With an ``Authenticator`` every route but ``/health`` needs ``Authorization: Bearer`` (``auth.py``:
401 otherwise; 403 when a tenant-bound token comes with another ``tenant`` / ``X-Tenant``), and the
header goes on to the router's gRPC calls. ``/health`` asks the router's gRPC health service, which
needs no token.
"""

import asyncio
import json
import logging
import time
import uuid

import grpc
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto.baton.v1 import generation_pb2, generation_pb2_grpc
from router.authentication import Authenticator, AuthRefused

from .auth import auth_middleware, caller_of, grpc_metadata, unauthorized
from .body import MAX_BODY_BYTES, read_json_body
from .errors import error_body, from_request_error, from_rpc_error
from .fields import RequestError
from .responses import Transcript
from .schema import parse_chat, parse_completion
from .translate import chat_to_pb, completion_to_pb

log = logging.getLogger(__name__)

_LIST_MODELS_TIMEOUT_S = 5.0
_SERVICE = "baton.v1.Generation"  # the health status /health reports


def build_app(channel: grpc.aio.Channel, authenticator: Authenticator | None = None) -> web.Application:
    """The application over a ``grpc.aio`` channel to the router (created on the serving loop);
    ``authenticator``: the bearer-token check (None: every request is let through, as before)."""
    api = _Api(
        generation_pb2_grpc.GenerationStub(channel), health_pb2_grpc.HealthStub(channel), authenticator
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
    ):
        self.stub = stub
        self.health_stub = health_stub
        self.authenticator = authenticator
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
                parsed = (parse_chat if chat else parse_completion)(body, request.headers)
                self._check_tenant(request, body, parsed.options.tenant)
                served = await self._served(request)
            except AuthRefused as refused:
                return _json(403, error_body(403, refused.message, code="permission_denied"))
            except RequestError as error:
                return _json(*from_request_error(error))
            except grpc.aio.AioRpcError as error:
                return _json(*from_rpc_error(error, chat))
            request_id = uuid.uuid4().hex
            options, prompt_ids = parsed.options, None
            if chat:
                message = chat_to_pb(parsed, request_id, served.max_model_len)
            else:
                message = completion_to_pb(parsed, request_id)
                prompt_ids = parsed.prompt if isinstance(parsed.prompt, tuple) else None
            transcript = Transcript(
                chat,
                f"{'chatcmpl' if chat else 'cmpl'}-{request_id}",
                options.model or served.id,
                int(time.time()),
                parsed.sampling.logprobs,
                options.return_token_ids,
                prompt_ids,
            )
            call = self.stub.Generate(message, timeout=options.timeout, metadata=grpc_metadata(request))
            try:
                if options.stream:
                    return await _stream(request, call, transcript, options.include_usage)
                async for reply in call:
                    transcript.chunk(reply)
                return web.json_response(transcript.response())
            except grpc.aio.AioRpcError as error:
                return _json(*from_rpc_error(error, chat))
            finally:
                call.cancel()  # a no-op once the call finished; frees the request otherwise
        finally:
            self.inflight.discard(task)

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


async def _stream(request: web.Request, call, transcript: Transcript, include_usage: bool):
    replies = call.__aiter__()
    reply = await anext(replies, None)  # refusals surface here, before any byte is sent
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    try:
        while reply is not None:
            await _event(response, transcript.chunk(reply))
            reply = await anext(replies, None)
        if include_usage and transcript.usage is not None:
            await _event(response, transcript.usage_chunk())
        await response.write(b"data: [DONE]\n\n")
    except grpc.aio.AioRpcError as error:
        await _event(response, from_rpc_error(error, transcript.chat)[1])
    except ConnectionResetError:
        return response  # the client went away; the caller cancels the call
    await response.write_eof()
    return response


async def _event(response: web.StreamResponse, data: dict) -> None:
    await response.write(b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n")


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
