"""The one place Python exceptions become gRPC status codes (every Baton server installs this).

ValueError        -> INVALID_ARGUMENT   (the message names the field)
NoCapacity        -> RESOURCE_EXHAUSTED (try another worker, or later)
KeyError          -> NOT_FOUND          (an unknown or already finished request)
TransferError     -> UNAVAILABLE        (the peer or the transfer failed)
TimeoutError      -> DEADLINE_EXCEEDED
anything else     -> INTERNAL           (logged with its traceback; the process keeps serving)
"""

import logging
from concurrent.futures import TimeoutError as FutureTimeout

import grpc

from services.engine.scheduler import NoCapacity
from services.transfer import TransferError

log = logging.getLogger(__name__)

_CODES = (
    (ValueError, grpc.StatusCode.INVALID_ARGUMENT),
    (NoCapacity, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (KeyError, grpc.StatusCode.NOT_FOUND),
    (TransferError, grpc.StatusCode.UNAVAILABLE),
    (TimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (FutureTimeout, grpc.StatusCode.DEADLINE_EXCEEDED),
)


def status_for(error: Exception) -> grpc.StatusCode:
    for kind, code in _CODES:
        if isinstance(error, kind):
            return code
    return grpc.StatusCode.INTERNAL


def _abort(context: grpc.ServicerContext, error: Exception, method: str) -> None:
    code = status_for(error)
    if code is grpc.StatusCode.INTERNAL:
        log.exception("%s failed", method)
    message = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    context.abort(code, str(message))


class ErrorInterceptor(grpc.ServerInterceptor):
    """Wraps unary and server-streaming handlers so an exception ends the call with its status."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            def unary(request, context):
                try:
                    return inner(request, context)
                except Exception as error:  # mapped to a status, never kills the server
                    _abort(context, error, method)

            return grpc.unary_unary_rpc_method_handler(
                unary, handler.request_deserializer, handler.response_serializer
            )
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            def streaming(request, context):
                try:
                    yield from inner_stream(request, context)
                except Exception as error:  # mapped to a status, never kills the server
                    _abort(context, error, method)

            return grpc.unary_stream_rpc_method_handler(
                streaming, handler.request_deserializer, handler.response_serializer
            )
        return handler
