"""Throwaway PKI for the TLS tests, made at test time with ``cryptography``: a CA, a router certificate
for localhost / 127.0.0.1, client certificates (one signed by the CA, one by a stranger CA), and internal
certificates naming ``baton-internal`` (one signed by the CA, one by the stranger CA)."""

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from common.internal_tls import INTERNAL_NAME


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files ``make_pki`` wrote."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path  # a client certificate signed by a CA the router does not trust
    stranger_key: Path
    other_key: Path  # a key that is not the server certificate's
    internal_cert: Path  # the cluster's processes' certificate (common/internal_tls.py), CA-signed
    internal_key: Path
    stranger_internal_cert: Path  # names baton-internal too, signed by the stranger CA
    stranger_internal_key: Path


def make_pki(folder: Path) -> Pki:
    """Write the CA, router, client and stranger files into ``folder``."""
    ca_key, ca = _authority("baton test CA")
    stranger_ca_key, stranger_ca = _authority("stranger CA")
    names = x509.SubjectAlternativeName(
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    )
    server_key, server = _leaf("router", ca, ca_key, names)
    client_key, client = _leaf("client", ca, ca_key, None)
    stranger_key, stranger = _leaf("stranger", stranger_ca, stranger_ca_key, None)
    internal_names = x509.SubjectAlternativeName([x509.DNSName(INTERNAL_NAME)])
    internal_key, internal = _leaf("worker", ca, ca_key, internal_names)
    stranger_internal_key, stranger_internal = _leaf("impostor", stranger_ca, stranger_ca_key, internal_names)
    files = {
        "ca": _cert_pem(ca),
        "server_cert": _cert_pem(server),
        "server_key": _key_pem(server_key),
        "client_cert": _cert_pem(client),
        "client_key": _key_pem(client_key),
        "stranger_cert": _cert_pem(stranger),
        "stranger_key": _key_pem(stranger_key),
        "other_key": _key_pem(ec.generate_private_key(ec.SECP256R1())),
        "internal_cert": _cert_pem(internal),
        "internal_key": _key_pem(internal_key),
        "stranger_internal_cert": _cert_pem(stranger_internal),
        "stranger_internal_key": _key_pem(stranger_internal_key),
    }
    for name, pem in files.items():
        (folder / f"{name}.pem").write_bytes(pem)
    return Pki(**{name: folder / f"{name}.pem" for name in files})


def _authority(name: str):
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        _builder(subject, subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(name: str, issuer: x509.Certificate, issuer_key, names: x509.SubjectAlternativeName | None):
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = _builder(subject, issuer.subject, key.public_key()).add_extension(
        x509.BasicConstraints(ca=False, path_length=None), critical=True
    )
    if names is not None:
        builder = builder.add_extension(names, critical=False)
    return key, builder.sign(issuer_key, hashes.SHA256())


def _builder(subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
