"""Helpers for the lifecycle tests: a router over given workers, the workers' held state, metrics."""

import time

import grpc

import deploy.local.router_process as deployed
from proto.baton.v1 import generation_pb2, generation_pb2_grpc, workers_pb2, workers_pb2_grpc
from tests.services.routers import scrape
from tests.services.workers import WorkerProcess


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


class RouterProcess(deployed.RouterProcess):
    """``baton router`` in its own process over test workers, started; ``stub`` calls it."""

    def __init__(self, model, prefill: list[WorkerProcess], decode: list[WorkerProcess], *flags: str):
        super().__init__(model, [p.address for p in prefill], [d.address for d in decode], *flags)
        self.channel: grpc.Channel | None = None
        self.start()

    def start(self, ready_timeout_s: float = 120.0) -> None:
        super().start(ready_timeout_s)
        if self.channel is not None:
            self.channel.close()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = generation_pb2_grpc.GenerationStub(self.channel)

    def metric(self, name: str, **labels) -> float:
        return scrape(self.metrics_port, name, **labels)

    def kill(self) -> None:
        """SIGKILL the router; the channel stays open so that calls in flight see the peer die
        (UNAVAILABLE), not a client-side close (CANCELLED). ``start`` replaces it."""
        super().kill()

    def stop(self) -> None:
        super().stop()
        self.channel.close()
