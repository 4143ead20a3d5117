"""``ServerTls``: the router's ``--tls-cert``, ``--tls-key`` and ``--tls-client-ca``, read and checked at
start, as gRPC server credentials and as the OpenAI front's ``ssl.SSLContext``.

Both public ports serve the same certificate. With a client CA, both require a client certificate
signed by it (mutual TLS): gRPC ``require_client_auth=True``, HTTP ``ssl.CERT_REQUIRED``.
"""

import ssl
from dataclasses import dataclass

import grpc


class TlsFileError(ValueError):
    """A TLS flag that is missing its pair, unreadable or does not load; the message names the flag."""


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
        context.load_cert_chain(self.cert, self.key, password=_no_password)
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
    cert_pem, key_pem = _read(cert, "--tls-cert"), _read(key, "--tls-key")
    client_ca_pem = _read(client_ca, "--tls-client-ca") if client_ca else None
    _check_certificates(cert_pem, "--tls-cert", cert)
    if client_ca_pem is not None:
        _check_certificates(client_ca_pem, "--tls-client-ca", client_ca)
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, password=_no_password)
    except _EncryptedKey:
        raise TlsFileError(f"--tls-key: {key} is encrypted; give the key unencrypted (PEM)") from None
    except ssl.SSLError as error:  # the certificate loads (checked above): the key is at fault
        if "KEY_VALUES_MISMATCH" in str(error):
            raise TlsFileError(f"--tls-key: {key} is not the private key of --tls-cert {cert}") from None
        reason = error.reason or error
        raise TlsFileError(f"--tls-key: {key} holds no usable PEM private key ({reason})") from None
    return ServerTls(cert, key, client_ca, cert_pem, key_pem, client_ca_pem)


class _EncryptedKey(Exception):
    pass


def _no_password() -> bytes:
    """Called by ssl only for an encrypted key: refuse it rather than prompt on the terminal."""
    raise _EncryptedKey


def _read(path: str, flag: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as error:
        raise TlsFileError(f"{flag}: cannot read {path} ({error.strerror or error})") from None


def _check_certificates(pem: bytes, flag: str, path: str) -> None:
    """TlsFileError naming ``flag`` unless ``pem`` holds at least one PEM certificate that loads."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=pem.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as error:
        reason = getattr(error, "reason", None) or error
        raise TlsFileError(f"{flag}: {path} holds no usable PEM certificate ({reason})") from None
