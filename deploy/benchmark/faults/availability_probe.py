"""Router availability during a fault run: ``ListModels`` and gRPC health, every ~50 ms, on a thread.

A call counts as available when it answered OK within ``budget_s`` (100 ms) over what an idle control
server (``deploy/benchmark/control_server.py``, its own process) took in the same round: on a
saturated machine the scheduler alone can hold any process that long, and that is not the router's
doing. ``strict_available`` counts the calls within the budget alone. The probe has its own channel,
so it waits on nothing the clients hold; it measures whether the router still answers while its
streams are being cancelled, failed over and killed under it.
"""

import threading
import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from deploy.benchmark.control_server import ControlServer
from proto.baton.v1 import generation_pb2, generation_pb2_grpc


@dataclass(frozen=True)
class Availability:
    """What the probe saw: calls made, how many answered OK within the budget, the slowest ones."""

    calls: int
    available: int  # OK within the budget over the control's latency in the same round
    strict_available: int  # OK within the budget alone
    failed: int  # answered with an error or not at all (1 s timeout)
    max_latency_s: float
    max_control_s: float
    budget_s: float
    slowest: tuple[tuple[str, float, str, float], ...]  # (call, seconds, status, control s), five slowest

    @property
    def fraction(self) -> float:
        """Available calls over all calls (1.0 when there were none)."""
        return self.available / self.calls if self.calls else 1.0

    @property
    def strict_fraction(self) -> float:
        """Calls within the budget alone over all calls."""
        return self.strict_available / self.calls if self.calls else 1.0


class AvailabilityProbe:
    """Calls the router at ``address`` every ``interval_s`` until ``stop()``, which returns the result."""

    def __init__(self, address: str, interval_s: float = 0.05, budget_s: float = 0.1, timeout_s: float = 1.0):
        self.interval_s, self.budget_s, self.timeout_s = interval_s, budget_s, timeout_s
        self._control_server = ControlServer()
        self._control_channel = grpc.insecure_channel(f"127.0.0.1:{self._control_server.port}")
        self._control = health_pb2_grpc.HealthStub(self._control_channel).Check
        self._channel = grpc.insecure_channel(address)
        self._calls = (
            (
                "ListModels",
                generation_pb2_grpc.GenerationStub(self._channel).ListModels,
                generation_pb2.ListModelsRequest(),
            ),
            ("Health", health_pb2_grpc.HealthStub(self._channel).Check, health_pb2.HealthCheckRequest()),
        )
        self._samples: list[tuple[str, float, str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="availability-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            rounds = [(name, *self._timed(method, request)) for name, method, request in self._calls]
            control, _ = self._timed(self._control, health_pb2.HealthCheckRequest())
            self._samples += [(name, seconds, status, control) for name, seconds, status in rounds]
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))

    def _timed(self, method, request) -> tuple[float, str]:
        start = time.monotonic()
        try:
            method(request, timeout=self.timeout_s)
            status = "OK"
        except grpc.RpcError as error:
            status = error.code().name
        return time.monotonic() - start, status

    def stop(self) -> Availability:
        """Stop probing; the calls made so far."""
        self._stop.set()
        self._thread.join(timeout=10)
        self._channel.close()
        self._control_channel.close()
        self._control_server.stop()
        samples = list(self._samples)
        answered = [s for s in samples if s[2] == "OK"]
        return Availability(
            calls=len(samples),
            available=sum(1 for s in answered if s[1] <= self.budget_s + s[3]),
            strict_available=sum(1 for s in answered if s[1] <= self.budget_s),
            failed=len(samples) - len(answered),
            max_latency_s=max((s[1] for s in samples), default=0.0),
            max_control_s=max((s[3] for s in samples), default=0.0),
            budget_s=self.budget_s,
            slowest=tuple(sorted(samples, key=lambda s: -s[1])[:5]),
        )
