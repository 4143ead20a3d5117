"""``--tls-cert`` / ``--tls-key`` / ``--tls-client-ca`` on real routers over one colocated decode worker,
with a PKI made at test time: TLS clients with the CA work over gRPC (raw, SDK sync and async, ``baton
client generate``, the load-test clients) and HTTPS, with the bearer token; plaintext clients fail;
with a client CA, a client without a certificate (or with a stranger's) is refused; bad flag
combinations are CLI errors naming the flag."""

import asyncio
import http.client
import json
import os
import shlex
import ssl

import grpc
import pytest

from cli.main import main
from cli.serve_command import announce
from loadtest.clients import open_client, parse_target
from loadtest.records import RequestRecord
from proto.baton.v1 import generation_pb2, generation_pb2_grpc
from router.server import RouterServer
from sdk import AsyncClient, Client, InvalidRequest, Unauthenticated, Unavailable
from sdk.tls import ClientTls
from tests.router_auth.auth_router import colocated_config
from tests.router_auth.certificates import make_pki
from tests.services.workers import running_workers

TOKEN = "tok-tls-0123456789"
LISTING = generation_pb2.ListModelsRequest()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def routers(tiny_checkpoint, tmp_path_factory, pki):
    """``{"tls": RouterServer, "mtls": RouterServer}`` over one worker, both with a token file."""
    model = tiny_checkpoint("kimi_linear")
    tokens = tmp_path_factory.mktemp("tls-auth") / "tokens"
    tokens.write_text(f"{TOKEN}\n")
    with running_workers(model, ("decode", "--dtype", "float32")) as (decode,):
        started = {}
        try:
            for name, client_ca in (("tls", ""), ("mtls", str(pki.ca))):
                started[name] = RouterServer(
                    colocated_config(
                        model,
                        decode.address,
                        tokens,
                        tls_cert=str(pki.server_cert),
                        tls_key=str(pki.server_key),
                        tls_client_ca=client_ca,
                    )
                )
            yield started
        finally:
            for server in started.values():
                server.stop()


def list_models(port: int, credentials: grpc.ChannelCredentials | None, token: str | None = TOKEN):
    """ListModels over a fresh channel (secure when ``credentials``)."""
    target = f"localhost:{port}"
    channel = (
        grpc.insecure_channel(target) if credentials is None else grpc.secure_channel(target, credentials)
    )
    metadata = () if token is None else (("authorization", f"Bearer {token}"),)
    with channel:
        return generation_pb2_grpc.GenerationStub(channel).ListModels(LISTING, metadata=metadata, timeout=10)


def https_get(port: int, path: str, context: ssl.SSLContext | None, token: str | None = TOKEN):
    """GET over HTTPS (plain HTTP when ``context`` is None): ``(status, JSON body)``."""
    if context is None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    else:
        connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    try:
        connection.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def ca_only(pki) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())


def with_client_cert(pki, cert, key) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(pki.ca.read_bytes(), key.read_bytes(), cert.read_bytes())


def test_grpc_over_tls_with_the_ca_and_token(routers, pki):
    port = routers["tls"].port
    assert list_models(port, ca_only(pki)).models
    with pytest.raises(grpc.RpcError) as error:  # TLS carries the token check unchanged
        list_models(port, ca_only(pki), token=None)
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as error:  # plaintext to a TLS port: no connection
        list_models(port, None)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    stranger = grpc.ssl_channel_credentials(root_certificates=pki.stranger_cert.read_bytes())
    with pytest.raises(grpc.RpcError) as error:  # a CA that did not sign the router's certificate
        list_models(port, stranger)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE


def test_https_with_the_ca_and_token_and_plain_http_fails(routers, pki):
    port = routers["tls"].http_port
    context = ssl.create_default_context(cafile=str(pki.ca))
    assert https_get(port, "/health", context)[0] == 200  # the front reaches gRPC over its socket
    assert os.stat(routers["tls"]._front_dir).st_mode & 0o777 == 0o700  # the socket's folder: ours only
    status, body = https_get(port, "/v1/models", context)
    assert status == 200 and body["data"]
    assert https_get(port, "/v1/models", context, token=None)[0] == 401
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        https_get(port, "/v1/models", None)  # plain HTTP to the TLS port: no HTTP reply
    with pytest.raises(ssl.SSLCertVerificationError):
        https_get(port, "/health", ssl.create_default_context())  # the system roots do not know it


def test_mutual_tls_refuses_a_client_without_a_certificate_from_the_ca(routers, pki):
    grpc_port, http_port = routers["mtls"].port, routers["mtls"].http_port
    assert list_models(grpc_port, with_client_cert(pki, pki.client_cert, pki.client_key)).models
    for refused in (ca_only(pki), with_client_cert(pki, pki.stranger_cert, pki.stranger_key)):
        with pytest.raises(grpc.RpcError) as error:
            list_models(grpc_port, refused)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    mutual = ssl.create_default_context(cafile=str(pki.ca))
    mutual.load_cert_chain(pki.client_cert, pki.client_key)
    status, body = https_get(http_port, "/v1/models", mutual)
    assert status == 200 and body["data"]
    assert https_get(http_port, "/health", mutual)[0] == 200
    stranger = ssl.create_default_context(cafile=str(pki.ca))
    stranger.load_cert_chain(pki.stranger_cert, pki.stranger_key)
    for context in (ssl.create_default_context(cafile=str(pki.ca)), stranger):
        with pytest.raises((ssl.SSLError, ConnectionError)):  # the handshake (or first read) fails
            https_get(http_port, "/v1/models", context)


def test_the_sdk_generates_over_tls_and_mutual_tls(routers, pki):
    address = f"localhost:{routers['tls'].port}"
    with Client(address, timeout_s=60, token=TOKEN, root_certificates=str(pki.ca)) as client:
        assert client.generate(prompt_ids=[1, 2, 3], max_tokens=2).usage.completion_tokens == 2
    with Client(address, timeout_s=10, root_certificates=pki.ca.read_bytes()) as client:  # PEM bytes
        with pytest.raises(Unauthenticated):
            client.list_models()
    with Client(address, timeout_s=5, token=TOKEN) as client, pytest.raises(Unavailable):
        client.list_models()  # plaintext
    mutual = dict(root_certificates=str(pki.ca), client_cert=str(pki.client_cert), client_key=pki.client_key)

    async def asynchronous():
        async with AsyncClient(f"localhost:{routers['mtls'].port}", timeout_s=60, token=TOKEN, **mutual) as c:
            return await c.generate(prompt_ids=[1, 2, 3], max_tokens=2)

    assert asyncio.run(asynchronous()).usage.completion_tokens == 2
    with pytest.raises(InvalidRequest, match="client_key: give it with client_cert"):
        Client(address, root_certificates=str(pki.ca), client_cert=str(pki.client_cert))


def test_client_generate_takes_the_tls_flags(routers, pki, tmp_path, capsys):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    flags = ["client", "generate", "--prompt-ids", "1,2", "--max-tokens", "2", "--json"]
    flags += ["--token-file", str(token_file), "--tls-ca", str(pki.ca)]
    mutual = ["--tls-cert", str(pki.client_cert), "--tls-key", str(pki.client_key)]
    assert main([*flags, "--addr", f"localhost:{routers['tls'].port}"]) == 0
    assert json.loads(capsys.readouterr().out)["usage"]["completion"] == 2
    assert main([*flags, *mutual, "--addr", f"localhost:{routers['mtls'].port}"]) == 0
    assert json.loads(capsys.readouterr().out)["usage"]["completion"] == 2
    assert main([*flags, "--addr", f"localhost:{routers['mtls'].port}"]) == 2  # no client certificate
    assert "UNAVAILABLE" in capsys.readouterr().err


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_loadtest_clients_connect_with_tls(routers, pki, scheme):
    router = routers["mtls"]
    port = router.port if scheme == "grpc" else router.http_port
    target = parse_target(f"{scheme}://localhost:{port}", explicit=False)
    mutual = ClientTls(str(pki.ca), str(pki.client_cert), str(pki.client_key))

    async def one(tls: ClientTls | None) -> RequestRecord:
        record = RequestRecord("s", 0, start_s=0.0, input_tokens=3)
        async with open_client(target, timeout_s=60, token=TOKEN, tls=tls) as client:
            await client.generate((1, 2, 3), 2, "s", record)
        return record

    record = asyncio.run(one(mutual))
    assert record.error is None and record.output_tokens == 2
    assert asyncio.run(one(None)).error is not None  # plaintext to the TLS port


FLAG_ERRORS = [
    pytest.param(["--tls-cert", "{server_cert}"], "--tls-cert: give its private key too", id="cert-no-key"),
    pytest.param(["--tls-key", "{server_key}"], "--tls-key: give its certificate too", id="key-no-cert"),
    pytest.param(["--tls-client-ca", "{ca}"], "--tls-client-ca: mutual TLS needs", id="client-ca-alone"),
    pytest.param(
        ["--tls-cert", "{server_cert}", "--tls-key", "{other_key}"],
        "--tls-key: {other_key} is not the private key of --tls-cert",
        id="mismatched-key",
    ),
    pytest.param(
        ["--tls-cert", "{folder}/absent.pem", "--tls-key", "{server_key}"],
        "--tls-cert: cannot read {folder}/absent.pem",
        id="unreadable-cert",
    ),
    pytest.param(
        ["--tls-cert", "{server_key}", "--tls-key", "{server_key}"],
        "--tls-cert: {server_key} holds no usable PEM certificate",
        id="cert-not-a-cert",
    ),
    pytest.param(
        ["--tls-cert", "{server_cert}", "--tls-key", "{server_key}", "--tls-client-ca", "{server_key}"],
        "--tls-client-ca: {server_key} holds no usable PEM certificate",
        id="client-ca-not-a-cert",
    ),
]


@pytest.mark.parametrize("command", ["router", "serve"])
@pytest.mark.parametrize(("flags", "says"), FLAG_ERRORS)
def test_bad_tls_flags_are_cli_errors_naming_the_flag(pki, tiny_checkpoint, capsys, command, flags, says):
    files = {name: str(path) for name, path in vars(pki).items()} | {"folder": str(pki.ca.parent)}
    model = str(tiny_checkpoint("kimi_linear"))
    # The router's check runs before it binds a port; serve's before any worker starts.
    start = (
        ["router", "--colocated", "--decode", "127.0.0.1:9", "--port", "0"]
        if command == "router"
        else ["serve"]
    )
    assert main([*start, "--model", model, *(flag.format(**files) for flag in flags)]) == 2
    assert f"baton {command}: error: {says.format(**files)}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--tls-cert", "{client_cert}"], "--tls-cert: give its private key too"),
        (["--tls-key", "{client_key}"], "--tls-key: give its certificate too"),
        (["--tls-cert", "{client_cert}", "--tls-key", "{client_key}"], "--tls-cert: mutual TLS needs the"),
        (["--tls-ca", "{folder}/absent.pem"], "--tls-ca: cannot read"),
    ],
    ids=["cert-no-key", "key-no-cert", "no-ca", "unreadable-ca"],
)
def test_bad_client_tls_flags_name_the_flag(pki, capsys, flags, says):
    files = {name: str(path) for name, path in vars(pki).items()} | {"folder": str(pki.ca.parent)}
    argv = ["client", "generate", "--addr", "localhost:9", "--prompt-ids", "1"]
    assert main([*argv, *(flag.format(**files) for flag in flags)]) == 2
    assert f"baton client: error: {says.format(**files)}" in capsys.readouterr().err


def test_serve_prints_example_commands_that_work_with_tls(routers, pki, tmp_path, capsys):
    router = routers["mtls"]
    http = f"127.0.0.1:{router.http_port}"
    announce(
        f"127.0.0.1:{router.port}", "127.0.0.1:1", [("decode-0", "127.0.0.1:2")], http, router.tls.current
    )
    lines = capsys.readouterr().out.splitlines()
    example = next(line for line in lines if line.startswith("send a request: "))
    curl = next(line for line in lines if line.startswith("or over HTTP: "))
    assert f"curl -s --cacert CA.pem --cert CLIENT.pem --key CLIENT.key https://{http}/v1/completions" in curl
    files = {"CA.pem": str(pki.ca), "CLIENT.pem": str(pki.client_cert), "CLIENT.key": str(pki.client_key)}
    argv = [files.get(word, word) for word in shlex.split(example.removeprefix("send a request: "))]
    assert argv[:3] == ["baton", "client", "generate"] and "--tls-ca" in argv and "--tls-key" in argv
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    argv[argv.index("--max-tokens") + 1] = "2"
    assert main([*argv[1:], "--token-file", str(token_file)]) == 0  # the printed command, as a user runs it
    assert json.loads(capsys.readouterr().out)["usage"]["completion"] == 2
    announce("127.0.0.1:1", "127.0.0.1:2", [], "127.0.0.1:3")  # without TLS: as before
    assert "--tls" not in capsys.readouterr().out
