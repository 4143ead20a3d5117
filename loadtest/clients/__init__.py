"""Load-test clients: one streamed generation into one ``RequestRecord``, over gRPC or OpenAI HTTP.

async with open_client(parse_target("grpc://127.0.0.1:50051", explicit=True)) as client:
    await client.generate(prompt_ids, max_tokens, session_id, record)
"""

from sdk.tls import ClientTls

from .base import Client
from .target import Target, is_loopback, parse_target


def open_client(
    target: Target,
    *,
    model: str | None = None,
    timeout_s: float | None = 600.0,
    token: str | None = None,
    tls: ClientTls | None = None,
) -> Client:
    """The client for ``target``'s scheme (call inside the event loop that will use it).

    Args:
        target: from ``parse_target`` (which enforces the loopback-or-explicit rule).
        model: the HTTP ``model`` field (ignored over gRPC, where the router serves one model).
        timeout_s: limit on each request.
        token: the bearer token each request carries (gRPC metadata or HTTP ``Authorization``); None: none.
        tls: connect with TLS (an ``http://`` target is then reached as ``https://``); None: plaintext.
    """
    if target.scheme == "grpc":
        from .grpc_client import GrpcClient

        return GrpcClient(target.address, timeout_s=timeout_s, token=token, tls=tls)
    if target.scheme == "http":
        from .http_client import HttpClient

        return HttpClient(target.url, model=model, timeout_s=timeout_s, token=token, tls=tls)
    raise ValueError(f"target: unsupported scheme {target.scheme!r}")


__all__ = ["Client", "Target", "is_loopback", "open_client", "parse_target"]
