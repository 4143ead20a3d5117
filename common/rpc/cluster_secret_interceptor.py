"""The cluster secret on the wire: the server side refuses internal calls without it, the client side
adds it to every call of a channel.

Server: ``ClusterSecretInterceptor(secret)`` in a worker's or a ``baton cache``'s interceptor list.
Every method but the standard health service's (``grpc.health.v1.Health``: Kubernetes and the
launcher probe it) needs metadata ``x-baton-cluster-secret`` equal to the secret, else the call ends
UNAUTHENTICATED before its handler runs, the details naming what is missing or wrong (never the
secret). Server reflection is refused too: it tells an outsider the internal API.

Client: ``with_cluster_secret(channel, secret)`` wraps a channel so every call on it (unary or
streaming) carries the metadata; with no secret it returns the channel unchanged.
"""

import collections

import grpc

from common.cluster_secret import METADATA_KEY, secret_matches

_OPEN_PREFIX = "/grpc.health.v1.Health/"
MISSING = f"{METADATA_KEY}: missing; this internal API needs the cluster secret (--cluster-secret-file)"
WRONG = f"{METADATA_KEY}: not this cluster's secret (--cluster-secret-file)"


class ClusterSecretInterceptor(grpc.ServerInterceptor):
    """Refuses every call but the health service's unless it carries the cluster secret."""

    def __init__(self, secret: str):
        self._secret = secret

    def intercept_service(self, continuation, handler_call_details):
        if handler_call_details.method.startswith(_OPEN_PREFIX):
            return continuation(handler_call_details)
        presented = [v for k, v in handler_call_details.invocation_metadata or () if k == METADATA_KEY]
        if len(presented) == 1 and secret_matches(presented[0], self._secret):
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        if handler is None:
            return None  # an unknown method stays UNIMPLEMENTED
        return _refusal(handler, MISSING if not presented else WRONG)


def _refusal(handler: grpc.RpcMethodHandler, details: str) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind that ends the call UNAUTHENTICATED without running it."""

    def refuse(_request, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, details)

    for kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
        if getattr(handler, kind) is not None:
            make = getattr(grpc, f"{kind}_rpc_method_handler")
            # Requests are not parsed: a refused caller's bytes are never read into a message.
            return make(refuse, request_deserializer=None, response_serializer=handler.response_serializer)
    raise ValueError(f"handler: no behaviour in {handler!r}")


class _ClientCallDetails(
    collections.namedtuple(
        "_ClientCallDetails",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    pass


class _SecretMetadata(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds ``x-baton-cluster-secret`` to every call's metadata."""

    def __init__(self, secret: str):
        self._pair = (METADATA_KEY, secret)

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = [pair for pair in details.metadata or () if pair[0] != METADATA_KEY]
        return _ClientCallDetails(
            details.method,
            details.timeout,
            metadata + [self._pair],
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)


def with_cluster_secret(channel: grpc.Channel, secret: str) -> grpc.Channel:
    """``channel`` sending the cluster secret on every call; ``secret`` "" returns it as it is.

    Close the channel given (the wrapper's ``close`` closes it too)."""
    if not secret:
        return channel
    return grpc.intercept_channel(channel, _SecretMetadata(secret))
