"""``baton router``: the router alone over a real worker (READY line, a request served, SIGTERM drains and
exits 0) and bad flag combinations answered with exit 2 and the flag to fix."""

import os
import signal
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cli.main import main
from proto.baton.v1 import generation_pb2, generation_pb2_grpc
from tests.services.workers import REPO


def start_router(*args: str) -> tuple[subprocess.Popen, dict[str, str]]:
    """``baton router ARGS`` in a subprocess; returns it and its READY line's fields."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    process = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "router", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    for line in process.stdout:
        seen.append(line)
        if line.startswith("READY "):
            return process, dict(field.split("=", 1) for field in line.split()[1:])
    process.wait(timeout=10)
    pytest.fail(f"baton router exited {process.returncode} before READY:\n{''.join(seen)}")


def request(max_tokens: int) -> generation_pb2.GenerateRequest:
    return generation_pb2.GenerateRequest(
        token_ids=generation_pb2.TokenIds(ids=[3, 1, 4, 1, 5]),
        sampling=generation_pb2.SamplingParameters(max_tokens=max_tokens, ignore_eos=True),
    )


def test_static_router_serves_then_drains_on_sigterm(decode_worker):
    model, worker = decode_worker
    flags = f"--model {model} --port 0 --decode {worker.address} --colocated --grace-period 60"
    process, ready = start_router(*flags.split())
    try:
        assert ready["role"] == "router" and ready["discovery"] == "static" and int(ready["metrics_port"]) > 0
        with grpc.insecure_channel(f"127.0.0.1:{ready['port']}") as channel:
            stub = generation_pb2_grpc.GenerationStub(channel)
            messages = list(stub.Generate(request(4), timeout=60))
            assert sum(len(m.token_ids) for m in messages) == 4
            assert messages[-1].finish_reason == generation_pb2.FINISH_REASON_LENGTH

            health = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=60)
            assert next(health).status == health_pb2.HealthCheckResponse.SERVING
            running = stub.Generate(request(600), timeout=120)
            received = len(next(running).token_ids)
            process.send_signal(signal.SIGTERM)
            assert next(health).status == health_pb2.HealthCheckResponse.NOT_SERVING
            health.cancel()
            received += sum(len(m.token_ids) for m in running)
            assert received == 600, "the request running at SIGTERM finished within the grace period"
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize(
    "flags, words",
    [
        ("", "--decode: give the decode workers"),
        ("--decode 10.0.0.1:9000", "--prefill: give the prefill workers"),
        ("--decode 10.0.0.1", "--decode: expected host:port"),
        ("--decode a:1 --prefill b:99999", "--prefill: expected host:port"),
        ("--decode a:1 --prefill b:2 --colocated", "--prefill: --colocated runs no prefill"),
        ("--decode a:1 --colocated --namespace ns", "--namespace: only with --discovery kubernetes"),
        ("--discovery kubernetes --prefill-selector p --decode-selector d", "--namespace: required"),
        ("--discovery kubernetes --namespace ns --decode-selector d", "--prefill-selector: required"),
        ("--discovery kubernetes --namespace ns --colocated", "--decode-selector: required"),
        ("--discovery kubernetes --decode a:1", "--decode: fixed addresses and --discovery kubernetes"),
        ("--decode a:1 --colocated --always-disaggregate", "choose one"),
        ("--decode a:1 --colocated --max-running 0", "--max-running: must be >= 1"),
        ("--decode a:1 --colocated --grace-period -1", "--grace-period: must be >= 0"),
        ("--decode a:1 --colocated --slo-ttft-ms 0", "--slo-ttft-ms: must be > 0"),
    ],
    ids=[
        "no-workers",
        "no-prefill",
        "no-port",
        "bad-port",
        "colocated-with-prefill",
        "kubernetes-flag-in-static",
        "no-namespace",
        "no-prefill-selector",
        "no-decode-selector",
        "addresses-with-kubernetes",
        "colocated-and-always",
        "max-running",
        "grace-period",
        "slo-ttft",
    ],
)
def test_bad_flags_exit_2_naming_the_flag(tmp_path, capsys, flags, words):
    assert main(["router", "--model", str(tmp_path), *flags.split()]) == 2
    assert words in capsys.readouterr().err


def test_bad_flags_exit_2_from_the_command_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "router", "--model", str(tmp_path), "--decode", "x"],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "baton router: error: --decode: expected host:port" in done.stderr
