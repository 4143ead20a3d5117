"""The TLS flags: a router's (``baton router`` / ``baton serve``: ``--tls-cert``, ``--tls-key``,
``--tls-client-ca``), a client's (``baton client generate`` / ``baton loadtest``: ``--tls-ca``, and
``--tls-cert`` / ``--tls-key`` for mutual TLS), and the internal mutual TLS between a cluster's processes
(``baton router`` / ``cache`` / ``serve``: ``--internal-tls-cert``, ``--internal-tls-key``,
``--internal-tls-ca``; ``baton worker`` has them as ``WorkerConfig`` fields). docs/authentication.md says
how to use them."""

import argparse

from common.internal_tls import INTERNAL_NAME
from sdk.tls import ClientTls


def add_router_tls_flags(parser: argparse.ArgumentParser) -> None:
    """The router's public ports (gRPC and OpenAI HTTP) over TLS; checked by ``router.tls.server_tls``."""
    group = parser.add_argument_group("TLS on the public gRPC and HTTP ports (docs/authentication.md)")
    group.add_argument(
        "--tls-cert", default="", metavar="FILE", help="PEM certificate (chain) to serve (default: no TLS)"
    )
    group.add_argument("--tls-key", default="", metavar="FILE", help="its PEM private key, unencrypted")
    group.add_argument(
        "--tls-client-ca",
        default="",
        metavar="FILE",
        help="mutual TLS: clients must present a certificate signed by this PEM CA (default: none asked)",
    )


def add_internal_tls_flags(parser: argparse.ArgumentParser, what: str) -> None:
    """``--internal-tls-cert``, ``--internal-tls-key``, ``--internal-tls-ca`` (dests ``internal_tls_*``,
    default ""); ``what``: the internal calls they secure for this command. Checked by
    ``common.internal_tls.internal_tls``."""
    group = parser.add_argument_group(
        f"Internal mutual TLS between the cluster's processes ({what}; docs/authentication.md)"
    )
    group.add_argument(
        "--internal-tls-cert",
        default="",
        metavar="FILE",
        help=f"this process's PEM certificate, naming {INTERNAL_NAME} in its subjectAltName "
        "(default: plaintext)",
    )
    group.add_argument(
        "--internal-tls-key", default="", metavar="FILE", help="its PEM private key, unencrypted"
    )
    group.add_argument(
        "--internal-tls-ca",
        default="",
        metavar="FILE",
        help="the cluster CA (PEM): the only signer of the certificates accepted",
    )


def add_client_tls_flags(parser: argparse.ArgumentParser) -> None:
    """A client's TLS to a router with ``--tls-cert``; read by ``client_tls_from``."""
    group = parser.add_argument_group("TLS to a router with --tls-cert (docs/authentication.md)")
    group.add_argument(
        "--tls-ca",
        default=None,
        metavar="FILE",
        help="PEM CA that signed the router's certificate: connect with TLS (default: plaintext)",
    )
    group.add_argument(
        "--tls-cert", default=None, metavar="FILE", help="mutual TLS: this client's PEM certificate"
    )
    group.add_argument("--tls-key", default=None, metavar="FILE", help="mutual TLS: its PEM private key")


def client_tls_from(args: argparse.Namespace) -> ClientTls | None:
    """The client's TLS from its flags (None: plaintext); each file is read here, so a bad one fails
    before any request.

    Raises:
        ValueError: naming the flag: ``--tls-cert`` without ``--tls-key`` (or the reverse), either
            without ``--tls-ca``, or a file that cannot be read.
    """
    if args.tls_cert is not None and args.tls_key is None:
        raise ValueError("--tls-cert: give its private key too (--tls-key)")
    if args.tls_key is not None and args.tls_cert is None:
        raise ValueError("--tls-key: give its certificate too (--tls-cert)")
    if args.tls_cert is not None and args.tls_ca is None:
        raise ValueError("--tls-cert: mutual TLS needs the router's CA too (--tls-ca)")
    if args.tls_ca is None:
        return None
    for flag, path in (("--tls-ca", args.tls_ca), ("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)):
        if path is not None:
            try:
                with open(path, "rb"):
                    pass
            except OSError as error:
                raise ValueError(f"{flag}: cannot read {path} ({error.strerror or error})") from None
    return ClientTls(args.tls_ca, args.tls_cert, args.tls_key)
