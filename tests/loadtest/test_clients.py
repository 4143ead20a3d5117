"""The gRPC and OpenAI HTTP clients against a real local cluster, plus targets and error mapping."""

import asyncio
import json
import socket

import pytest
from aiohttp import web

from loadtest.clients import open_client, parse_target
from loadtest.clients.http_client import _error
from loadtest.records import RequestRecord
from loadtest.scrape import counter_deltas, metrics_url, parse_counters

SCHEMES = ("grpc", "http")


def target_of(cluster, scheme: str):
    port = cluster.port if scheme == "grpc" else cluster.router.http_port
    return parse_target(f"{scheme}://127.0.0.1:{port}", explicit=False)


def send(target, prompt, max_tokens: int = 6, session_id: str = "s") -> RequestRecord:
    async def one() -> RequestRecord:
        record = RequestRecord(session_id, 0, start_s=10.0, input_tokens=len(prompt))
        async with open_client(target, timeout_s=120) as client:
            await client.generate(tuple(prompt), max_tokens, session_id, record)
        return record

    return asyncio.run(one())


def test_both_clients_fill_the_same_counts(loadtest_cluster):
    records = {}
    for scheme in SCHEMES:  # a turn, then the next one extending it, as in a conversation
        prompt = [17 + (i * 7) % 900 for i in range(80)] + [30 + SCHEMES.index(scheme)] * 16
        target = target_of(loadtest_cluster, scheme)
        records[scheme] = [
            send(target, prompt[:64], session_id=scheme),
            send(target, prompt, session_id=scheme),
        ]
    for scheme in SCHEMES:
        for record in records[scheme]:
            assert record.ok, record.error
            assert record.output_tokens == len(record.token_times_s) == 6
            assert record.token_times_s == sorted(record.token_times_s)
            assert 10.0 < record.token_times_s[0] <= record.end_s  # times on the caller's clock
    assert records["grpc"][0].cached_tokens == 0  # nothing cached before the very first request
    assert records["grpc"][1].cached_tokens == records["http"][1].cached_tokens > 0  # prefix-cache hits


@pytest.mark.parametrize("scheme", SCHEMES)
def test_out_of_vocabulary_id_is_invalid_argument(loadtest_cluster, scheme):
    record = send(target_of(loadtest_cluster, scheme), [20, 10**6, 21])
    assert record.error.startswith("INVALID_ARGUMENT: ") and "vocabulary" in record.error
    assert record.end_s is not None and record.output_tokens == 0 and not record.ok


@pytest.mark.parametrize("scheme", SCHEMES)
def test_unreachable_server_is_unavailable(scheme):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    record = send(parse_target(f"{scheme}://127.0.0.1:{port}", explicit=False), [20, 21])
    assert record.error.startswith("UNAVAILABLE: ") and record.end_s is not None


@pytest.mark.parametrize("scheme", SCHEMES)
def test_cancelling_a_request_raises_and_leaves_no_end(loadtest_cluster, scheme):
    async def cancelled() -> RequestRecord:
        record = RequestRecord("c", 0, start_s=0.0, input_tokens=3)
        async with open_client(target_of(loadtest_cluster, scheme)) as client:
            task = asyncio.ensure_future(client.generate((20, 21, 22), 5000, "c", record))
            while not record.token_times_s:
                await asyncio.sleep(0.005)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        return record

    record = asyncio.run(cancelled())
    assert record.end_s is None and record.error is None


def test_http_client_reads_streams_without_token_ids():
    """vLLM / SGLang style: no ``token_ids`` in chunks, usage after the last one, null details."""
    seen = {}

    async def completions(request: web.Request) -> web.StreamResponse:
        seen.update(body=await request.json(), session=request.headers.get("x-session-id"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunks = [{"choices": [{"text": text, "finish_reason": None}]} for text in ("a", "", "b")]
        chunks += [{"choices": [{"text": "c", "finish_reason": "length"}]}]
        chunks += [{"choices": [], "usage": {"completion_tokens": 4, "prompt_tokens_details": None}}]
        for chunk in chunks:
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    async def scenario() -> RequestRecord:
        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        record = RequestRecord("v", 0, start_s=0.0, input_tokens=2)
        try:
            async with open_client(
                parse_target(f"http://127.0.0.1:{port}", explicit=False), model="m"
            ) as client:
                await client.generate((20, 21), 4, "v", record)
        finally:
            await runner.cleanup()
        return record

    record = asyncio.run(scenario())
    assert record.ok and record.output_tokens == len(record.token_times_s) == 4 and record.cached_tokens == 0
    body = seen["body"]
    assert body["prompt"] == [20, 21] and body["max_tokens"] == 4 and body["model"] == "m"
    assert body["ignore_eos"] and body["stream"] and body["stream_options"] == {"include_usage": True}
    assert seen["session"] == "v"


def test_targets_are_loopback_unless_explicit():
    assert parse_target("grpc://localhost:50051", explicit=False).address == "localhost:50051"
    assert parse_target("http://[::1]:8000/", explicit=False).url == "http://[::1]:8000"
    assert parse_target("http://10.0.0.7:8000", explicit=True).host == "10.0.0.7"
    with pytest.raises(ValueError, match="--target: 10.0.0.7 is not a loopback"):
        parse_target("http://10.0.0.7:8000", explicit=False)
    for bad in ("", "https://127.0.0.1:1", "127.0.0.1:50051", "grpc://127.0.0.1", "http://127.0.0.1:80/v1"):
        with pytest.raises(ValueError, match="--target"):
            parse_target(bad, explicit=True)
    assert metrics_url("http://127.0.0.1:9400", explicit=False) == "http://127.0.0.1:9400/metrics"
    with pytest.raises(ValueError, match="--metrics-url"):
        metrics_url("http://example.com:9400/metrics", explicit=False)


@pytest.mark.parametrize(
    "status, body, want",
    [
        (
            400,
            '{"error": {"message": "prompt: bad", "code": "invalid_argument"}}',
            "INVALID_ARGUMENT: prompt: bad",
        ),
        (
            429,
            '{"error": {"message": "queue full", "type": "rate_limit_error"}}',
            "RESOURCE_EXHAUSTED: queue full",
        ),
        (500, '{"error": {"message": "too long", "code": 400}}', "INVALID_ARGUMENT: too long"),  # vLLM style
        (503, "upstream\nconnect error", "UNAVAILABLE: upstream connect error"),
        (418, "{}", "UNKNOWN: {}"),
    ],
    ids=["baton-400", "baton-429", "vllm-in-stream", "not-json", "unknown-status"],
)
def test_http_errors_map_to_grpc_codes(status, body, want):
    assert _error(status, body) == want


def test_counter_deltas():
    before = parse_counters(
        "# TYPE baton_prompt_tokens_total counter\nbaton_prompt_tokens_total 10\n"
        '# TYPE baton_transfer_bytes_total counter\nbaton_transfer_bytes_total{backend="nixl"} 100\n'
    )
    after = parse_counters(
        "# TYPE baton_prompt_tokens_total counter\nbaton_prompt_tokens_total 25\n"
        "baton_prompt_tokens_created 1.7e9\n"
        '# TYPE baton_transfer_bytes_total counter\nbaton_transfer_bytes_total{backend="nixl"} 40\n'
        'baton_transfer_bytes_total{backend="grpc_bytes"} 7\n'
        "# TYPE spec_accepted_tokens_total counter\nspec_accepted_tokens_total 3\n"
        "# TYPE other_total counter\nother_total 9\n"
        "# TYPE baton_kv_blocks_used gauge\nbaton_kv_blocks_used 4\n"
    )
    assert counter_deltas(before, after) == {
        "baton_prompt_tokens_total": 15.0,
        "baton_transfer_bytes_total": {"grpc_bytes": 7.0, "nixl": 40.0},  # nixl restarted: its value
        "spec_accepted_tokens_total": 3.0,
    }
