"""Typed errors: every failed call raises a ``BatonError`` subclass chosen by its gRPC status code.

INVALID_ARGUMENT   -> InvalidArgument    (the details name the field; also raised client-side)
RESOURCE_EXHAUSTED -> ResourceExhausted  (queue full or no capacity; retried, see ``sdk.retry``)
UNAVAILABLE        -> Unavailable        (the router or a worker failed; retried, see ``sdk.retry``)
DEADLINE_EXCEEDED  -> DeadlineExceeded
NOT_FOUND          -> NotFound
UNAUTHENTICATED    -> Unauthenticated    (no token, or one the router does not hold: ``token=``)
PERMISSION_DENIED  -> PermissionDenied   (the token is bound to another tenant than the request's)
CANCELLED          -> Cancelled
anything else      -> InternalError      (keeps the real code, e.g. INTERNAL or UNIMPLEMENTED)
"""

import grpc


class BatonError(Exception):
    """A call that failed. ``code`` is the gRPC status code, ``details`` the server's message;
    ``str(error)`` is ``"CODE: details"``."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, details: str, code: grpc.StatusCode | None = None):
        super().__init__(details)
        self.details = details
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code.name}: {self.details}"

    def __reduce__(self):
        return type(self), (self.details, self.code)


class InvalidArgument(BatonError):
    """The request is malformed or out of range; retrying it cannot help."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class InvalidRequest(InvalidArgument, ValueError):
    """An argument the SDK rejects before sending (wrong type or shape); the details name it.

    Both an ``InvalidArgument`` (like the server's answer) and a ``ValueError``."""


class ResourceExhausted(BatonError):
    """The router's queue is full or no worker has room; worth retrying later."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(BatonError):
    """The router could not be reached, or a worker failed during the request."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(BatonError):
    """The call's deadline (``timeout_s``) passed before it finished."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(BatonError):
    """An unknown model or request."""

    code = grpc.StatusCode.NOT_FOUND


class Unauthenticated(BatonError):
    """The router needs a bearer token (``token=``) and got none, or one it does not hold."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(BatonError):
    """The token is valid but may not do this (it is bound to another tenant than the request names)."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Cancelled(BatonError):
    """The call was cancelled (by this client or the server)."""

    code = grpc.StatusCode.CANCELLED


class InternalError(BatonError):
    """Any other status (INTERNAL, UNKNOWN, UNIMPLEMENTED, ...); ``code`` keeps the real one."""

    code = grpc.StatusCode.INTERNAL


_BY_CODE: dict[grpc.StatusCode, type[BatonError]] = {
    kind.code: kind
    for kind in (
        InvalidArgument,
        ResourceExhausted,
        Unavailable,
        DeadlineExceeded,
        NotFound,
        Cancelled,
        Unauthenticated,
        PermissionDenied,
    )
}


def from_rpc_error(error: grpc.RpcError) -> BatonError:
    """The typed error for a failed call (sync ``grpc.RpcError`` or ``grpc.aio.AioRpcError``).

    Returns the class mapped from the status code, with ``details`` kept; codes without their own
    class become ``InternalError`` carrying the original code."""
    code = error.code() if callable(getattr(error, "code", None)) else grpc.StatusCode.UNKNOWN
    details = error.details() if callable(getattr(error, "details", None)) else str(error)
    kind = _BY_CODE.get(code)
    if kind is None:
        return InternalError(details or "", code)
    return kind(details or "")
