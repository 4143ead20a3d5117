"""``--auth-token-file`` on a real router (one colocated decode worker) and its OpenAI front: no,
wrong and right tokens over gRPC and HTTP, health open, the token's tenant as the prefix cache's
salt and a contradicting tenant refused, reload without restart, the refusal metric, SDK ``token=``
and ``baton client generate --token-file``."""

import asyncio
import json
import os
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2

from cli.main import main
from loadtest.clients import open_client, parse_target
from loadtest.records import RequestRecord
from proto.baton.v1 import generation_pb2
from sdk import AsyncClient, Client, PermissionDenied, Unauthenticated
from tests.router_auth.auth_router import auth_router
from tests.router_http.client import get, post
from tests.services.routers import scrape

OPEN, ACME, BETA = "tok-open-0123456789", "tok-acme-0123456789", "tok-beta-0123456789"
TOKENS = f"# test tokens\n{OPEN}\n\n{ACME} acme\n{BETA}   beta\n"


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture(scope="module")
def router(tiny_checkpoint, tmp_path_factory):
    token_file = tmp_path_factory.mktemp("auth") / "tokens"
    token_file.write_text(TOKENS)
    with auth_router(tiny_checkpoint("kimi_linear"), token_file) as server:
        yield server


def refused(router, reason: str) -> float:
    return scrape(router.metrics_port, "baton_auth_refused_total", reason=reason)


def generate(stub, prompt_ids, metadata, tenant: str = ""):
    request = generation_pb2.GenerateRequest(
        token_ids=generation_pb2.TokenIds(ids=prompt_ids), tenant=tenant, sampling={"max_tokens": 2}
    )
    return list(stub.Generate(request, metadata=metadata, timeout=60))[-1]


def hit_soon(stub, prompt_ids, metadata, attempts: int = 20) -> bool:
    """Whether the prompt hits the cache within a few tries: the worker commits a finished
    request's blocks to its prefix cache a moment after the stream ends."""
    for _ in range(attempts):
        if generate(stub, prompt_ids, metadata).usage.cached_tokens > 0:
            return True
        time.sleep(0.05)
    return False


def test_grpc_needs_a_valid_bearer_token_and_health_stays_open(router):
    before = {reason: refused(router, reason) for reason in ("missing", "malformed", "invalid")}
    listing = generation_pb2.ListModelsRequest()
    for metadata, reason, says in (
        ((), "missing", "authorization: missing"),
        ((("authorization", OPEN),), "malformed", "expected 'Bearer <token>'"),
        (bearer("tok-wrong-0123456789"), "invalid", "not valid"),
    ):
        with pytest.raises(grpc.RpcError) as error:
            router.stub.ListModels(listing, metadata=metadata, timeout=10)
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert says in error.value.details() and "0123456789" not in error.value.details()
        assert refused(router, reason) == before[reason] + 1
    with pytest.raises(grpc.RpcError) as error:  # a streaming method is refused the same way
        generate(router.stub, [1, 2, 3], ())
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert router.stub.ListModels(listing, metadata=bearer(OPEN), timeout=10).models
    check = router.health_stub.Check(health_pb2.HealthCheckRequest(service="baton.v1.Generation"), timeout=10)
    assert check.status == health_pb2.HealthCheckResponse.SERVING


def test_http_needs_a_valid_bearer_token_and_health_stays_open(router):
    port = router.http_port
    assert get(port, "/health").status == 200
    for headers in ({}, {"Authorization": "Basic abc"}, {"Authorization": "Bearer tok-wrong-0123456789"}):
        for reply in (get(port, "/v1/models", headers=headers), post(port, "/v1/completions", {}, headers)):
            assert reply.status == 401 and reply.headers["WWW-Authenticate"] == "Bearer"
            error = reply.body["error"]
            assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"
            assert error["message"].startswith("authorization: ") and "0123456789" not in error["message"]
    reply = get(port, "/v1/models", headers={"Authorization": f"Bearer {OPEN}"})
    assert reply.status == 200 and reply.body["data"]
    body = {"prompt": [5, 6, 7], "max_tokens": 2, "ignore_eos": True}
    reply = post(port, "/v1/completions", body, {"Authorization": f"Bearer {ACME}"})
    assert reply.status == 200 and reply.body["usage"]["completion_tokens"] == 2


def test_a_tenant_bound_token_refuses_another_tenant(router):
    before = refused(router, "tenant")
    with pytest.raises(grpc.RpcError) as error:
        generate(router.stub, [1, 2, 3], bearer(ACME), tenant="beta")
    assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert error.value.details().startswith("tenant: 'beta' is not the tenant")
    port, auth = router.http_port, {"Authorization": f"Bearer {ACME}"}
    body = {"prompt": [1, 2, 3], "max_tokens": 2}
    reply = post(port, "/v1/completions", {**body, "tenant": "beta"}, auth)
    assert reply.status == 403 and reply.body["error"]["message"].startswith("tenant: 'beta'")
    reply = post(port, "/v1/completions", body, {**auth, "X-Tenant": "beta"})
    assert reply.status == 403 and reply.body["error"]["message"].startswith("X-Tenant: 'beta'")
    assert refused(router, "tenant") == before + 3
    assert generate(router.stub, [1, 2, 3], bearer(ACME), tenant="acme").finish_reason  # its own: fine


def test_the_tokens_tenant_salts_the_prefix_cache(router):
    prompt = list(range(100, 148))  # three whole blocks of 16
    assert generate(router.stub, prompt, bearer(ACME)).usage.cached_tokens == 0
    assert hit_soon(router.stub, prompt, bearer(ACME))  # acme's own blocks
    assert generate(router.stub, prompt, bearer(BETA)).usage.cached_tokens == 0  # not beta's
    assert generate(router.stub, prompt, bearer(OPEN)).usage.cached_tokens == 0  # nor tenant-less
    # a token without a tenant keeps today's behaviour: the asserted tenant is the salt
    assert generate(router.stub, prompt, bearer(OPEN), tenant="acme").usage.cached_tokens > 0


def test_the_sdk_sends_its_token_on_every_call(router):
    address = f"127.0.0.1:{router.port}"
    with Client(address, timeout_s=30, token=OPEN) as client:
        assert client.list_models()[0].id
        assert client.generate(prompt_ids=[1, 2, 3], max_tokens=2).usage.completion_tokens == 2
    with Client(address, timeout_s=30) as client, pytest.raises(Unauthenticated):
        client.list_models()
    with Client(address, timeout_s=30, token=ACME) as client, pytest.raises(PermissionDenied):
        client.generate(prompt_ids=[1, 2, 3], max_tokens=2, tenant="beta")

    async def asynchronous():
        async with AsyncClient(address, timeout_s=30, token=BETA) as client:
            completion = await client.generate(prompt_ids=[1, 2, 3], max_tokens=2)
        async with AsyncClient(address, timeout_s=30, token="tok-wrong") as client:
            with pytest.raises(Unauthenticated):
                await client.list_models()
        return completion

    assert asyncio.run(asynchronous()).usage.completion_tokens == 2


def test_client_generate_reads_its_token_file(router, tmp_path, capsys):
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text(f"# mine\n\n{ACME} acme\n")  # the router's own format works as is
    bad.write_text("tok-wrong-0123456789\n")
    flags = ["client", "generate", "--addr", f"127.0.0.1:{router.port}", "--prompt-ids", "1,2", "--json"]
    assert main([*flags, "--max-tokens", "2", "--token-file", str(good)]) == 0
    assert json.loads(capsys.readouterr().out)["usage"]["completion"] == 2
    assert main([*flags, "--token-file", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "UNAUTHENTICATED: authorization: the bearer token is not valid" in err and "0123456789" not in err
    assert main([*flags, "--token-file", str(tmp_path / "absent")]) == 2
    assert "error: --token-file: cannot read" in capsys.readouterr().err


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_loadtest_clients_send_the_token(router, scheme):
    port = router.port if scheme == "grpc" else router.http_port
    target = parse_target(f"{scheme}://127.0.0.1:{port}", explicit=False)

    async def one(token: str | None) -> RequestRecord:
        record = RequestRecord("s", 0, start_s=0.0, input_tokens=3)
        async with open_client(target, timeout_s=60, token=token) as client:
            await client.generate((1, 2, 3), 2, "s", record)
        return record

    assert asyncio.run(one(BETA)).error is None and asyncio.run(one(BETA)).output_tokens == 2
    error = asyncio.run(one(None)).error
    assert "authorization: missing" in error and error.startswith("UNAUTHENTICATED")


def test_a_changed_file_is_reloaded_without_restart(router):
    listing, path = generation_pb2.ListModelsRequest(), router.token_file
    failures = scrape(router.metrics_port, "baton_auth_token_file_reload_failures_total")
    staged = path.with_suffix(".new")
    staged.write_text(f"tok-new-0123456789 acme\n{BETA} beta\n")
    os.replace(staged, path)  # atomic: a reader sees the old file or the new one
    time.sleep(1.05)  # the file is checked at most once a second
    with pytest.raises(grpc.RpcError) as error:
        router.stub.ListModels(listing, metadata=bearer(ACME), timeout=10)
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert router.stub.ListModels(listing, metadata=bearer("tok-new-0123456789"), timeout=10).models
    assert (
        get(router.http_port, "/v1/models", headers={"Authorization": "Bearer tok-new-0123456789"}).status
        == 200
    )
    # A broken file: the tokens loaded before stay, the failure is counted.
    path.write_text("tok-new-0123456789 acme\none two three\n")
    time.sleep(1.05)
    assert router.stub.ListModels(listing, metadata=bearer("tok-new-0123456789"), timeout=10).models
    assert scrape(router.metrics_port, "baton_auth_token_file_reload_failures_total") == failures + 1
    path.write_text(TOKENS)  # as the other tests expect it
    time.sleep(1.05)
    assert router.stub.ListModels(listing, metadata=bearer(ACME), timeout=10).models
