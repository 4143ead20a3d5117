"""The HTTP side of ``--auth-token-file``: every route but ``/health`` needs ``Authorization: Bearer``.

A refused request gets 401 (missing, malformed or unknown token) with an OpenAI error body, code
``invalid_api_key``, and ``WWW-Authenticate: Bearer``; the check runs before the body is read. The
caller a valid token proves is kept on the request (``caller_of``) for the tenant check, and the
header is passed on to the router's gRPC API (``grpc_metadata``), which checks it again.
"""

from aiohttp import web

from router.auth_tokens import Caller
from router.authentication import Authenticator, AuthRefused

from .errors import error_body

OPEN_PATHS = frozenset({"/health"})  # readiness probes carry no token
_CALLER = web.RequestKey("baton_caller", Caller)


def auth_middleware(authenticator: Authenticator):
    """An aiohttp middleware refusing unauthenticated requests to every route outside OPEN_PATHS."""

    @web.middleware
    async def authenticate(request: web.Request, handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        try:
            request[_CALLER] = authenticator.authenticate(request.headers.get("Authorization"))
        except AuthRefused as refused:
            return unauthorized(refused.message)
        return await handler(request)

    return authenticate


def unauthorized(message: str) -> web.Response:
    """401 with the OpenAI body and the ``WWW-Authenticate`` challenge."""
    body = error_body(401, message, code="invalid_api_key")
    return web.json_response(body, status=401, headers={"WWW-Authenticate": "Bearer"})


def caller_of(request: web.Request) -> Caller | None:
    """The caller the request's token proved; None when the front checks no tokens."""
    return request.get(_CALLER)


def grpc_metadata(request: web.Request) -> tuple[tuple[str, str], ...]:
    """The request's ``Authorization`` as gRPC metadata for the router (empty without one, or when
    the value could not travel as metadata: the router then refuses the call itself)."""
    value = request.headers.get("Authorization", "")
    if not value or not (value.isascii() and value.isprintable()):
        return ()
    return (("authorization", value),)
