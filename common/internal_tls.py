"""Mutual TLS between a cluster's own processes (routers, workers, ``baton cache`` tiers): the flags
``--internal-tls-cert``, ``--internal-tls-key`` and ``--internal-tls-ca``, read and checked at start.

Every process serves its internal gRPC port with its certificate and accepts only clients presenting a
certificate signed by the CA; every internal channel presents the process's certificate and accepts
only servers whose certificate the CA signed and that name ``INTERNAL_NAME`` (a DNS name in the
certificate's subjectAltName). Processes are checked by that name, not by their address: pods come and
go with new IPs, so one certificate (or one per process, all naming ``INTERNAL_NAME``) serves the whole
cluster. This encrypts the internal calls (the cluster secret travels inside) and keeps a process
without a cluster certificate off every internal port; the standard health service stays open on the
same TLS port (Kubernetes probes it over TLS). docs/authentication.md, "Internal trust".
"""

from dataclasses import dataclass

import grpc

from .tls_files import TlsFileError, check_certificates, check_key_pair, read_pem

INTERNAL_NAME = "baton-internal"  # the DNS name every internal certificate carries
FLAGS = ("--internal-tls-cert", "--internal-tls-key", "--internal-tls-ca")


@dataclass(frozen=True)
class InternalTls:
    """A process's internal certificate, key and the cluster CA (PEM bytes), as ``internal_tls`` read
    them; ``files`` are the paths (passed on to the processes a launcher starts)."""

    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes
    files: tuple[str, str, str]

    def server_credentials(self) -> grpc.ServerCredentials:
        """An internal port's credentials: this certificate, clients signed by the CA only."""
        return grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)], root_certificates=self.ca_pem, require_client_auth=True
        )

    def channel(self, address: str, options: list | None = None) -> grpc.Channel:
        """A channel to another process of the cluster (``grpc.aio`` is not needed here)."""
        credentials = grpc.ssl_channel_credentials(self.ca_pem, self.key_pem, self.cert_pem)
        return grpc.secure_channel(address, credentials, options=[*(options or []), *self.channel_options()])

    @staticmethod
    def channel_options() -> list[tuple[str, str]]:
        """The server's certificate is checked for ``INTERNAL_NAME``, whatever address was dialled."""
        return [("grpc.ssl_target_name_override", INTERNAL_NAME)]


def internal_tls(cert: str, key: str, ca: str) -> InternalTls | None:
    """The process's internal TLS from its three flags' paths; None when none is given (plaintext).

    Raises:
        TlsFileError: naming the flag: one or two of the three given (all or none), a file that cannot
            be read, a certificate or CA that is not PEM, a key that is not the certificate's or is
            encrypted.
    """
    given = (cert, key, ca)
    if not any(given):
        return None
    missing = [flag for flag, path in zip(FLAGS, given, strict=True) if not path]
    if missing:
        raise TlsFileError(
            f"{missing[0]}: internal mutual TLS needs all of {', '.join(FLAGS)} (a certificate naming "
            f"{INTERNAL_NAME!r}, its key, the cluster CA)"
        )
    cert_pem, key_pem, ca_pem = (read_pem(path, flag) for path, flag in zip(given, FLAGS, strict=True))
    check_certificates(cert_pem, FLAGS[0], cert)
    check_certificates(ca_pem, FLAGS[2], ca)
    check_key_pair(cert, key, FLAGS[0], FLAGS[1])
    return InternalTls(cert_pem, key_pem, ca_pem, given)


def insecure_or_internal_channel(
    address: str, tls: InternalTls | None, options: list | None = None
) -> grpc.Channel:
    """A channel to another process of the cluster: over ``tls`` when the cluster runs internal TLS."""
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return tls.channel(address, options)


def bind_internal_port(server: grpc.Server, address: str, tls: InternalTls | None) -> int:
    """Bind ``server`` to ``address`` (TLS with ``tls``); returns the port (0: could not bind)."""
    if tls is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, tls.server_credentials())
