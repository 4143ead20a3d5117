"""``ReloadingTls``: a router's TLS files replaced on disk are served to the next connection, on gRPC
(dynamic server credentials) and HTTPS (the SNI callback), without a restart; files that do not load
leave the previous certificate in place and are reported once."""

import os
import shutil
import socket
import ssl
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from router.tls import server_tls
from router.tls_reload import ReloadingTls
from tests.router_auth.certificates import make_pki


@pytest.fixture
def rotation(tmp_path):
    """Two PKIs (the first one's server files in place as ``cert.pem`` / ``key.pem``) and the
    ``ReloadingTls`` over those paths, checking the files at every handshake."""
    first, second = make_pki(_folder(tmp_path, "first")), make_pki(_folder(tmp_path, "second"))
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    _install(first, cert, key)
    failures = []
    tls = ReloadingTls(
        server_tls(str(cert), str(key)), check_interval_s=0.0, on_reload_error=lambda: failures.append(1)
    )
    return first, second, cert, key, tls, failures


def test_grpc_serves_the_new_certificate_after_the_files_change(rotation):
    first, second, cert, key, tls, failures = rotation
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_secure_port("127.0.0.1:0", tls.grpc_credentials())
    server.start()
    try:
        assert _grpc_ok(port, first.ca) and not _grpc_ok(port, second.ca)
        _install(second, cert, key)
        assert _grpc_ok(port, second.ca) and not _grpc_ok(port, first.ca)
        shutil.copyfile(first.other_key, key)  # a key that is not the certificate's: not loaded
        assert _grpc_ok(port, second.ca) and failures == [1]
        assert _grpc_ok(port, second.ca) and failures == [1]  # reported once per change
    finally:
        server.stop(0).wait()


def test_https_serves_the_new_certificate_after_the_files_change(rotation):
    first, second, cert, key, tls, failures = rotation
    context = tls.ssl_context()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        serving = threading.Thread(target=_serve_handshakes, args=(listener, context), daemon=True)
        serving.start()
        assert _https_ok(port, first.ca) and not _https_ok(port, second.ca)
        _install(second, cert, key)
        assert _https_ok(port, second.ca) and not _https_ok(port, first.ca)
        os.remove(cert)  # gone: the loaded certificate stays
        assert _https_ok(port, second.ca) and failures == [1]


def _folder(root, name):
    folder = root / name
    folder.mkdir()
    return folder


def _install(pki, cert, key) -> None:
    """Replace the served files as a rotation does: new files renamed over the old ones."""
    for source, target in ((pki.server_cert, cert), (pki.server_key, key)):
        shutil.copyfile(source, f"{target}.new")
        os.replace(f"{target}.new", target)


def _grpc_ok(port: int, ca) -> bool:
    credentials = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
    with grpc.secure_channel(f"localhost:{port}", credentials) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.UNAVAILABLE  # the handshake failed
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def _serve_handshakes(listener: socket.socket, context: ssl.SSLContext) -> None:
    while True:
        try:
            connection, _ = listener.accept()
        except OSError:
            return  # the listener closed: the test is over
        try:
            with context.wrap_socket(connection, server_side=True) as wrapped:
                wrapped.sendall(b"ok")
        except (ssl.SSLError, OSError):
            connection.close()  # the client refused our certificate


def _https_ok(port: int, ca) -> bool:
    client = ssl.create_default_context(cafile=str(ca))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            with client.wrap_socket(raw, server_hostname="127.0.0.1") as wrapped:
                return wrapped.recv(2) == b"ok"
    except ssl.SSLCertVerificationError:
        return False
