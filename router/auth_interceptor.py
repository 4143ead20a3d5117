"""``AuthInterceptor``: every public gRPC call needs ``authorization: Bearer <token>`` metadata.

The standard health service (``grpc.health.v1.Health``) stays open for Kubernetes probes; every
other method (``baton.v1.Generation``, reflection) is refused without a valid token:
UNAUTHENTICATED, or PERMISSION_DENIED when a tenant-bound token comes with a request naming
another ``tenant``. A request message with a ``tenant`` field gets the token's tenant written into
it, so everything downstream (the prefix hashes, the workers) sees the authenticated tenant.

Install it inside ``ErrorInterceptor`` (after it in the server's list): its handlers then receive
parsed requests, and the status it aborts with is kept.
"""

import grpc

from .authentication import Authenticator, AuthRefused

_OPEN_PREFIX = "/grpc.health.v1.Health/"


class AuthInterceptor(grpc.ServerInterceptor):
    """Wraps every handler but the health service's with the token check of ``authenticator``."""

    def __init__(self, authenticator: Authenticator):
        self.authenticator = authenticator

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(_OPEN_PREFIX):
            return handler
        metadata = dict(handler_call_details.invocation_metadata or ())
        try:
            caller, refusal = self.authenticator.authenticate(metadata.get("authorization")), None
        except AuthRefused as refused:
            caller, refusal = None, refused

        def admit(request, context):
            """The request as it may run (tenant set), or abort the call."""
            if refusal is not None:
                _abort(context, refusal)
            if "tenant" in type(request).DESCRIPTOR.fields_by_name:
                try:
                    request.tenant = self.authenticator.tenant(caller, request.tenant, "tenant")
                except AuthRefused as refused:
                    _abort(context, refused)
            return request

        def admit_each(requests, context):
            if refusal is not None:
                _abort(context, refusal)
            for request in requests:
                yield admit(request, context)

        kind, inner = _kind(handler)
        if kind == "unary_unary":
            wrapped = lambda request, context: inner(admit(request, context), context)  # noqa: E731
        elif kind == "unary_stream":

            def wrapped(request, context):
                yield from inner(admit(request, context), context)

        elif kind == "stream_unary":
            wrapped = lambda requests, context: inner(admit_each(requests, context), context)  # noqa: E731
        else:

            def wrapped(requests, context):
                yield from inner(admit_each(requests, context), context)

        make = getattr(grpc, f"{kind}_rpc_method_handler")
        return make(wrapped, handler.request_deserializer, handler.response_serializer)


def _kind(handler: grpc.RpcMethodHandler):
    for kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
        behaviour = getattr(handler, kind)
        if behaviour is not None:
            return kind, behaviour
    raise ValueError(f"handler: no behaviour in {handler!r}")


def _abort(context: grpc.ServicerContext, refused: AuthRefused) -> None:
    code = grpc.StatusCode.UNAUTHENTICATED if refused.unauthenticated else grpc.StatusCode.PERMISSION_DENIED
    context.abort(code, refused.message)
