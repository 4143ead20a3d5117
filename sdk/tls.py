"""``ClientTls``: what a client needs to reach a router with ``--tls-cert`` (and ``--tls-client-ca``).

    Client("router.example:50051", root_certificates="ca.pem")                  # TLS
    Client(..., root_certificates="ca.pem", client_cert="me.pem", client_key="me.key")  # mutual TLS

Each is a path to a PEM file or the PEM bytes themselves. The router's certificate must name the host
the client dials (its subject alternative names), as with any TLS client.
"""

import os
import ssl
from dataclasses import dataclass

import grpc
import grpc.aio

from .errors import InvalidRequest

PemSource = str | os.PathLike | bytes


@dataclass(frozen=True)
class ClientTls:
    """The CA that signed the router's certificate (None: the system's roots) and, for mutual TLS,
    this client's certificate and key (both or neither)."""

    root_certificates: PemSource | None = None
    client_cert: PemSource | None = None
    client_key: PemSource | None = None

    def __post_init__(self):
        if self.client_cert is not None and self.client_key is None:
            raise InvalidRequest("client_key: give it with client_cert (mutual TLS needs both)")
        if self.client_key is not None and self.client_cert is None:
            raise InvalidRequest("client_cert: give it with client_key (mutual TLS needs both)")

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials; InvalidRequest naming the argument whose file cannot be read."""
        return grpc.ssl_channel_credentials(
            root_certificates=_pem(self.root_certificates, "root_certificates"),
            private_key=_pem(self.client_key, "client_key"),
            certificate_chain=_pem(self.client_cert, "client_cert"),
        )

    def ssl_context(self) -> ssl.SSLContext:
        """An ``ssl.SSLContext`` for HTTPS to the router's OpenAI front (hostname checked). A client
        certificate must be given as paths here (``ssl`` loads it only from files)."""
        context = ssl.create_default_context()
        if self.root_certificates is not None:
            pem = _pem(self.root_certificates, "root_certificates")
            try:
                context.load_verify_locations(cadata=pem.decode("ascii"))
            except (ssl.SSLError, UnicodeDecodeError) as error:
                raise InvalidRequest(f"root_certificates: no usable PEM certificate ({error})") from None
        if self.client_cert is not None:
            if isinstance(self.client_cert, bytes) or isinstance(self.client_key, bytes):
                raise InvalidRequest("client_cert: give paths, not bytes, for HTTPS (ssl loads files)")
            try:
                context.load_cert_chain(self.client_cert, self.client_key, password=_no_password)
            except (OSError, ssl.SSLError) as error:
                raise InvalidRequest(
                    f"client_cert: {self.client_cert} with its key does not load ({error})"
                ) from None
        return context


def channel(address: str, options: list, tls: ClientTls | None, aio: bool = False):
    """A secure channel to ``address`` with ``tls``, else a plaintext one (``grpc.aio`` when ``aio``)."""
    module = grpc.aio if aio else grpc
    if tls is None:
        return module.insecure_channel(address, options=options)
    return module.secure_channel(address, tls.credentials(), options=options)


def client_tls(
    root_certificates: PemSource | None, client_cert: PemSource | None, client_key: PemSource | None
) -> ClientTls | None:
    """The clients' TLS arguments as one ``ClientTls``; None when none is given (plaintext)."""
    if root_certificates is None and client_cert is None and client_key is None:
        return None
    return ClientTls(root_certificates, client_cert, client_key)


def _no_password() -> bytes:
    """Called by ssl only for an encrypted key: refuse it rather than prompt on the terminal."""
    raise ssl.SSLError("client_key: an encrypted key; give it unencrypted")


def _pem(source: PemSource | None, name: str) -> bytes | None:
    if source is None or isinstance(source, bytes):
        return source
    try:
        with open(source, "rb") as file:
            return file.read()
    except OSError as error:
        raise InvalidRequest(f"{name}: cannot read {source} ({error.strerror or error})") from None
