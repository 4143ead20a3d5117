"""``baton serve`` end to end: the cluster comes up, answers ``baton client``, survives a worker's
death (restarted on its port), and Ctrl-C leaves no process behind."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from services.engine import LLM, SamplingParams
from tests.services.workers import REPO

ENV = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")


def client(port: int, *extra: str) -> dict:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.main",
            "client",
            "generate",
            "--addr",
            f"127.0.0.1:{port}",
            "--json",
            *extra,
        ],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def served(tiny_checkpoint):
    model = tiny_checkpoint("deepseek_v32")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli.main",
            "serve",
            "--model",
            str(model),
            "--port",
            "0",
            "--dtype",
            "float32",
        ],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline, line = time.monotonic() + 240, ""
    while time.monotonic() < deadline and not line.startswith("SERVING"):
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            break
    if not line.startswith("SERVING"):
        process.kill()
        pytest.fail(f"baton serve did not come up: {line!r}")
    port = int(line.split("router=127.0.0.1:")[1].split()[0])
    workers = dict(part.split("@") for part in line.split("workers=")[1].split(","))
    yield model, process, port, workers
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)


def worker_pids(name: str, parent: int) -> list[int]:
    """The ``baton worker`` processes named ``name`` that ``parent`` (this test's serve) started."""
    pattern = f"cli.main worker .*--name {name}( |$)"
    found = subprocess.run(["pgrep", "-P", str(parent), "-f", pattern], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_client_through_the_served_cluster(served):
    model, _, port, _ = served
    prompt = [(7 * i + 3) % 97 for i in range(40)]  # longer than --local-prefill-tokens: handed off
    ids = ",".join(map(str, prompt))
    result = client(port, "--prompt-ids", ids, "--max-tokens", "5", "--logprobs")
    want = LLM(str(model), dtype="float32").generate([prompt], SamplingParams(max_tokens=5, temperature=0))[0]
    assert result["token_ids"] == want.token_ids
    assert result["route"]["transfer_backend"] == "nixl" and result["route"]["transfer_bytes"] > 0
    assert result["usage"]["prompt"] == 40 and len(result["logprobs"]) == len(result["token_ids"])


def test_a_dead_worker_is_restarted_and_serving_resumes(served):
    _, process, port, _ = served
    before = worker_pids("decode-0", process.pid)
    assert len(before) == 1
    os.kill(before[0], signal.SIGKILL)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        after = worker_pids("decode-0", process.pid)
        if after and after != before:
            break
        time.sleep(0.5)
    else:
        pytest.fail("the decode worker was not restarted")
    for _ in range(60):  # the new process needs a moment before it is READY
        try:
            assert client(port, "--prompt-ids", "1,2,3", "--max-tokens", "2")["token_ids"]
            break
        except AssertionError:
            time.sleep(1)
    else:
        pytest.fail("no request succeeded after the restart")


def test_ctrl_c_stops_every_process(served):
    _, process, _, workers = served
    pids = [pid for name in workers for pid in worker_pids(name, process.pid)]
    assert len(pids) == len(workers)
    # No --redis-url or --no-redis: serve started a redis-server (HiCache's cluster index) of its own.
    found = subprocess.run(["pgrep", "-P", str(process.pid), "redis-server"], capture_output=True, text=True)
    redis = [int(pid) for pid in found.stdout.split()]
    assert len(redis) == 1
    process.send_signal(signal.SIGINT)
    process.wait(timeout=60)
    assert process.returncode == 0
    assert not [pid for pid in pids + redis if alive(pid)]
