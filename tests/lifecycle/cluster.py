"""Helpers for the lifecycle tests: a router over given workers, the workers' held state, metrics."""

import subprocess
import sys
import threading
import time
from typing import NamedTuple
from urllib.request import urlopen

import grpc
from prometheus_client.parser import text_string_to_metric_families

from proto.baton.v1 import generation_pb2, generation_pb2_grpc, workers_pb2, workers_pb2_grpc
from router.server import RouterServer
from tests.services.workers import REPO, WorkerProcess


class Router(NamedTuple):
    server: RouterServer
    stub: generation_pb2_grpc.GenerationStub

    def metric(self, name: str, **labels) -> float:
        return scrape(self.server.metrics_port, name, **labels)


def scrape(metrics_port: int, name: str, **labels) -> float:
    text = urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


def request(prompt: list[int], max_tokens: int, request_id: str = "") -> generation_pb2.GenerateRequest:
    return generation_pb2.GenerateRequest(
        request_id=request_id,
        token_ids=generation_pb2.TokenIds(ids=prompt),
        sampling=generation_pb2.SamplingParameters(max_tokens=max_tokens, ignore_eos=True),
    )


def prompt_of(length: int, seed: int) -> list[int]:
    return [(seed * 31 + 7 * i) % 97 + 1 for i in range(length)]


def integrity(worker: WorkerProcess) -> workers_pb2.PoolIntegrity:
    with grpc.insecure_channel(worker.address) as channel:
        stub_class = (
            workers_pb2_grpc.DecodeWorkerStub
            if worker.worker.role == "decode"
            else workers_pb2_grpc.PrefillWorkerStub
        )
        return stub_class(channel).CheckIntegrity(workers_pb2.IntegrityRequest(), timeout=10)


def holds_nothing(state: workers_pb2.PoolIntegrity) -> bool:
    return (
        state.ok
        and (state.used_blocks, state.used_slots, state.running, state.waiting, state.reserved, state.held)
        == (0, 0, 0, 0, 0, 0)
        and not state.request_ids
    )


def wait_until(condition, timeout_s: float, what: str, poll_s: float = 0.02):
    """Poll ``condition()`` until it returns something truthy (returned); fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(poll_s)


def assert_idle(*workers: WorkerProcess, timeout_s: float) -> float:
    """Every worker holds nothing (blocks, slots, requests) within ``timeout_s``; returns how long it took."""
    started = time.monotonic()
    for worker in workers:
        last = []

        def idle(worker=worker, last=last):
            last[:] = [integrity(worker)]
            return holds_nothing(last[0])

        try:
            wait_until(idle, max(0.0, timeout_s - (time.monotonic() - started)), f"{worker.worker.name} idle")
        except AssertionError:
            raise AssertionError(f"{worker.worker.name} still holds: {last[0]}") from None
    return time.monotonic() - started


def worker_metric(worker: WorkerProcess, name: str, **labels) -> float:
    ready = next(line for line in worker.worker.output if line.startswith("READY "))
    return scrape(int(ready.split("metrics_port=")[1].split()[0]), name, **labels)


def freed(decode: WorkerProcess, reason: str) -> float:
    """``baton_reservations_freed_total{reason}`` of a decode worker."""
    return worker_metric(decode, "baton_reservations_freed_total", reason=reason)


class RouterProcess:
    """``baton router`` in its own process (a GIL and a life of its own: killed, started again on the
    same port); ``stub`` calls it."""

    def __init__(self, model, prefill: list[WorkerProcess], decode: list[WorkerProcess], *flags: str):
        self.command = [
            sys.executable,
            "-m",
            "cli.main",
            "router",
            "--model",
            str(model),
            "--prefill",
            ",".join(p.address for p in prefill),
            "--decode",
            ",".join(d.address for d in decode),
            *flags,
        ]
        self.port = 0
        self.process: subprocess.Popen | None = None
        self.channel: grpc.Channel | None = None
        self.start()

    def start(self, ready_timeout_s: float = 120.0) -> None:
        self.process = subprocess.Popen(
            [*self.command, "--port", str(self.port)], cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        line = _read_line(self.process, ready_timeout_s)
        assert line.startswith("READY "), f"router did not start: {line!r}"
        fields = dict(field.split("=", 1) for field in line.split()[1:])
        self.port, self.metrics_port = int(fields["port"]), int(fields["metrics_port"])
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = generation_pb2_grpc.GenerationStub(self.channel)

    def metric(self, name: str, **labels) -> float:
        return scrape(self.metrics_port, name, **labels)

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, its connections just drop."""
        self.process.kill()
        self.process.wait(timeout=30)
        self.channel.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        self.channel.close()


def _read_line(process: subprocess.Popen, timeout_s: float) -> str:
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return lines[0] if lines else ""
