"""The one place Python exceptions become gRPC status codes (every Baton server installs this).

ValueError        -> INVALID_ARGUMENT   (the message names the field; ``request`` for bytes that do
                                        not parse as the method's message)
NoCapacity        -> RESOURCE_EXHAUSTED (try another worker, or later)
KeyError          -> NOT_FOUND          (an unknown or already finished request)
TransferError     -> UNAVAILABLE        (the peer or the transfer failed)
TimeoutError      -> DEADLINE_EXCEEDED
anything else     -> INTERNAL           (logged with its traceback; the process keeps serving)
"""

import logging
from concurrent.futures import TimeoutError as FutureTimeout

import grpc

from common.errors import InUse, NoCapacity, TransferError

log = logging.getLogger(__name__)

_CODES = (
    (InUse, grpc.StatusCode.FAILED_PRECONDITION),  # before ValueError: AdapterInUse is both
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
    if context.code() not in (None, grpc.StatusCode.OK):
        raise error  # the handler ended the call itself (``context.abort``): keep its status
    code = status_for(error)
    if code is grpc.StatusCode.INTERNAL:
        log.exception("%s failed", method)
    message = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    context.abort(code, str(message))


class MalformedRequest(ValueError):
    """Request bytes that are not the method's protobuf message (or hold a string that is not UTF-8)."""


def _tolerant(deserializer, method: str):
    """``deserializer`` that returns a MalformedRequest instead of raising: grpc would answer its
    exception with INTERNAL, a client's bad bytes are INVALID_ARGUMENT."""
    if deserializer is None:
        return None

    def parse(data: bytes):
        try:
            return deserializer(data)
        except Exception as error:  # upb's DecodeError, or whatever a custom deserializer raises
            return MalformedRequest(f"request: not a valid protobuf message for {method} ({error})")

    return parse


def _parsed(request):
    if isinstance(request, MalformedRequest):
        raise request
    return request


def _parsed_stream(requests):
    for request in requests:
        yield _parsed(request)


class ErrorInterceptor(grpc.ServerInterceptor):
    """Wraps every handler so an exception ends the call with its status, and request bytes that do
    not parse end it with INVALID_ARGUMENT (the server keeps serving either way)."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        deserializer = _tolerant(handler.request_deserializer, method)
        serializer = handler.response_serializer
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            def unary(request, context):
                try:
                    return inner(_parsed(request), context)
                except Exception as error:  # mapped to a status, never kills the server
                    _abort(context, error, method)

            return grpc.unary_unary_rpc_method_handler(unary, deserializer, serializer)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            def streaming(request, context):
                try:
                    yield from inner_stream(_parsed(request), context)
                except Exception as error:  # mapped to a status, never kills the server
                    _abort(context, error, method)

            return grpc.unary_stream_rpc_method_handler(streaming, deserializer, serializer)
        if handler.stream_unary is not None:
            inner_collect = handler.stream_unary

            def collecting(requests, context):
                try:
                    return inner_collect(_parsed_stream(requests), context)
                except Exception as error:  # mapped to a status, never kills the server
                    _abort(context, error, method)

            return grpc.stream_unary_rpc_method_handler(collecting, deserializer, serializer)
        inner_both = handler.stream_stream

        def both(requests, context):
            try:
                yield from inner_both(_parsed_stream(requests), context)
            except Exception as error:  # mapped to a status, never kills the server
                _abort(context, error, method)

        return grpc.stream_stream_rpc_method_handler(both, deserializer, serializer)
