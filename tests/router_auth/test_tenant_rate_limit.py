"""Per-tenant request rate limits (``--tenant-rate-limit``, ``--tenant-burst``): the token bucket on a
fake clock, and on a real router (one colocated decode worker) behind tenant-bound tokens, where one
tenant over its limit gets RESOURCE_EXHAUSTED / HTTP 429 while another is still served, counted in
``baton_router_rate_limited_total``."""

import grpc
import pytest

from cli.main import main
from router.tenant_rate_limit import RateLimited, TenantRateLimit
from tests.router_auth.auth_router import auth_router
from tests.router_auth.test_public_auth import ACME, BETA, TOKENS, bearer, generate
from tests.router_http.client import post
from tests.services.routers import scrape


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_then_the_rate_and_tenants_apart():
    clock = Clock()
    limit = TenantRateLimit(rate=2.0, burst=3, clock=clock)
    for _ in range(3):
        limit.check("acme")
    with pytest.raises(
        RateLimited, match=r"tenant 'acme': over its rate limit \(2 requests/s, burst 3\); retry in 500 ms"
    ):
        limit.check("acme")
    limit.check("beta")  # its own bucket
    clock.now += 0.25  # half a request refilled: still refused, sooner
    with pytest.raises(RateLimited, match="retry in 250 ms"):
        limit.check("acme")
    clock.now += 0.25
    limit.check("acme")
    clock.now += 60  # refills to the burst, not beyond
    for _ in range(3):
        limit.check("acme")
    with pytest.raises(RateLimited, match=r"tenant \(no tenant\)"):
        for _ in range(4):
            limit.check("")


def test_buckets_are_bounded_least_recently_used_first():
    clock = Clock()
    limit = TenantRateLimit(rate=1.0, burst=1, clock=clock, max_tenants=2)
    limit.check("a")
    limit.check("b")
    limit.check("c")  # "a" is dropped: it comes back with a fresh burst
    limit.check("a")
    with pytest.raises(RateLimited):
        limit.check("c")


@pytest.mark.parametrize(
    ("rate", "burst", "words"),
    [
        (0.0, None, "--tenant-rate-limit: must be a positive"),
        (float("inf"), None, "--tenant-rate-limit"),
        (1.0, 0, "--tenant-burst"),
    ],
)
def test_bad_limits_name_the_flag(rate, burst, words):
    with pytest.raises(ValueError, match=words):
        TenantRateLimit(rate, burst)


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        ("--tenant-burst 2", "--tenant-burst: needs --tenant-rate-limit"),
        ("--tenant-rate-limit -1", "--tenant-rate-limit: must be a positive"),
        ("--tenant-rate-limit 2 --tenant-burst -3", "--tenant-burst: must be >= 1"),
    ],
)
def test_router_flags_exit_2_naming_the_flag(tmp_path, capsys, flags, words):
    assert main(["router", "--model", str(tmp_path), "--decode", "a:1", "--colocated", *flags.split()]) == 2
    assert words in capsys.readouterr().err


@pytest.fixture(scope="module")
def limited_router(tiny_checkpoint, tmp_path_factory):
    token_file = tmp_path_factory.mktemp("auth") / "tokens"
    token_file.write_text(TOKENS)
    # one request per 100 s after the burst: no refill during the test
    with auth_router(
        tiny_checkpoint("kimi_linear"), token_file, tenant_rate_limit=0.01, tenant_burst=2
    ) as server:
        yield server


def test_a_tenant_over_its_limit_is_refused_and_another_still_served(limited_router):
    router = limited_router
    limited = scrape(router.metrics_port, "baton_router_rate_limited_total")
    for _ in range(2):
        assert generate(router.stub, [5, 6, 7], bearer(ACME)).finish_reason
    with pytest.raises(grpc.RpcError) as error:
        generate(router.stub, [5, 6, 7], bearer(ACME))
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.value.details().startswith("tenant 'acme': over its rate limit (0.01 requests/s, burst 2)")
    reply = post(
        router.http_port,
        "/v1/completions",
        {"prompt": [5, 6, 7], "max_tokens": 2},
        {"Authorization": f"Bearer {ACME}"},
    )
    assert reply.status == 429 and reply.body["error"]["type"] == "rate_limit_error"
    assert reply.body["error"]["message"].startswith("tenant 'acme': over its rate limit")
    assert generate(router.stub, [5, 6, 7], bearer(BETA)).finish_reason  # beta's bucket is its own
    assert scrape(router.metrics_port, "baton_router_rate_limited_total") == limited + 2


def test_serve_refuses_a_bad_limit_before_starting_anything(tiny_checkpoint, capsys):
    model = str(tiny_checkpoint("kimi_linear"))
    assert main(["serve", "--model", model, "--tenant-rate-limit", "nan"]) == 2
    assert "--tenant-rate-limit: must be a positive" in capsys.readouterr().err
