"""The one place errors become OpenAI error bodies and HTTP statuses.

gRPC status        HTTP  type
INVALID_ARGUMENT   400   invalid_request_error   (param: the field the router named, in OpenAI terms)
UNAUTHENTICATED    401   invalid_request_error   (code invalid_api_key: no or a wrong bearer token)
PERMISSION_DENIED  403   permission_error        (the token is bound to another tenant)
NOT_FOUND          404   not_found_error
RESOURCE_EXHAUSTED 429   rate_limit_error        (the router's queue is full: retry later)
CANCELLED          499   cancelled
UNAVAILABLE        503   service_unavailable
DEADLINE_EXCEEDED  504   timeout                 (the request's ``timeout`` passed)
anything else      500   internal_error
"""

import re

import grpc

from .fields import RequestError

_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
_TYPE = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    499: "cancelled",
    503: "service_unavailable",
    504: "timeout",
}
# Router field names (``sampling.top_p``, ``token_ids``) -> the field the OpenAI client sent.
_FIELD = re.compile(r"^([A-Za-z_][\w.\[\]]*): (.*)$", re.DOTALL)
_PROMPT_FIELDS = ("prompt", "text", "token_ids", "chat")


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """``{"error": {"message", "type", "param", "code"}}`` as OpenAI sends it."""
    return {
        "error": {
            "message": message,
            "type": _TYPE.get(status, "internal_error"),
            "param": param,
            "code": code,
        }
    }


def from_request_error(error: RequestError) -> tuple[int, dict]:
    """A request refused by the front's own validation."""
    return error.status, error_body(error.status, error.message, error.param)


def from_rpc_error(error: grpc.aio.AioRpcError, chat: bool) -> tuple[int, dict]:
    """A gRPC status from the router -> (HTTP status, body). ``chat`` decides whether a prompt
    field is reported as ``messages`` or ``prompt``."""
    code = error.code()
    status = _STATUS.get(code, 500)
    message, param = error.details() or code.name.lower(), None
    match = _FIELD.match(message)
    if match is not None:
        field, rest = match.groups()
        if field in _PROMPT_FIELDS:
            param = "messages" if chat else "prompt"
        elif chat and field.startswith("chat."):  # chat.tools[1].name: the body's tools[1].name
            param = field.removeprefix("chat.")
        elif field.startswith("sampling.structured_output"):  # what the body's response_format became
            param = "response_format"
        else:
            param = field.removeprefix("sampling.")
        message = f"{param}: {rest}"
    name = "invalid_api_key" if status == 401 else code.name.lower()
    return status, error_body(status, message, param, name)
