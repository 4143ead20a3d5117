"""``ServerTls``: the router's ``--tls-cert``, ``--tls-key`` and ``--tls-client-ca``, read and checked at
start, as gRPC server credentials and as the OpenAI front's ``ssl.SSLContext``.

Both public ports serve the same certificate. With a client CA, both require a client certificate
signed by it (mutual TLS): gRPC ``require_client_auth=True``, HTTP ``ssl.CERT_REQUIRED``.
"""

import ssl
from dataclasses import dataclass

import grpc

from common.tls_files import TlsFileError, check_certificates, check_key_pair, no_password, read_pem


@dataclass(frozen=True)
class ServerTls:
    """The router's TLS files (paths) and their PEM bytes, as read and checked by ``server_tls``."""

    cert: str
    key: str
    client_ca: str  # "": no client certificate asked for
    cert_pem: bytes
    key_pem: bytes
    client_ca_pem: bytes | None

    @property
    def mutual(self) -> bool:
        """Whether clients must present a certificate signed by ``client_ca``."""
        return self.client_ca_pem is not None

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """The public gRPC port's credentials."""
        return grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)],
            root_certificates=self.client_ca_pem,
            require_client_auth=self.mutual,
        )

    def ssl_context(self) -> ssl.SSLContext:
        """The OpenAI HTTP port's context (TLS 1.2 or later)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key, password=no_password)
        if self.mutual:
            context.load_verify_locations(cadata=self.client_ca_pem.decode("ascii"))
            context.verify_mode = ssl.CERT_REQUIRED
        return context


def server_tls(cert: str, key: str, client_ca: str = "") -> ServerTls | None:
    """The router's TLS from its flags' paths; None when none is given (plaintext, as before).

    Raises:
        TlsFileError: naming the flag: a cert without a key or the reverse, ``--tls-client-ca``
            without ``--tls-cert``, a file that cannot be read, a cert or key that is not PEM (or an
            encrypted key), a key that is not the cert's, a client CA holding no certificate.
    """
    if not (cert or key or client_ca):
        return None
    if client_ca and not cert:
        raise TlsFileError("--tls-client-ca: mutual TLS needs the router's own --tls-cert and --tls-key")
    if cert and not key:
        raise TlsFileError("--tls-cert: give its private key too (--tls-key)")
    if key and not cert:
        raise TlsFileError("--tls-key: give its certificate too (--tls-cert)")
    cert_pem, key_pem = read_pem(cert, "--tls-cert"), read_pem(key, "--tls-key")
    client_ca_pem = read_pem(client_ca, "--tls-client-ca") if client_ca else None
    check_certificates(cert_pem, "--tls-cert", cert)
    if client_ca_pem is not None:
        check_certificates(client_ca_pem, "--tls-client-ca", client_ca)
    check_key_pair(cert, key, "--tls-cert", "--tls-key")
    return ServerTls(cert, key, client_ca, cert_pem, key_pem, client_ca_pem)
