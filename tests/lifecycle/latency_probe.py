"""``python -m tests.lifecycle.latency_probe PORT CONTROL_PORT``: calls the router's health Check and
ListModels, and an idle control server's health Check (``deploy/benchmark/control_server.py``), in
a loop until its stdin closes, then prints as JSON the slowest of each in seconds, the rounds made,
and the rounds in which the router's slower call took more than 100 ms over the control's.

Its own process, so the 100 client threads of the test measuring it do not share its GIL (their wake-up
on cancellation would be measured as the router's latency)."""

import json
import sys
import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto.baton.v1 import generation_pb2, generation_pb2_grpc

BUDGET_S = 0.1  # issue 11: health and ListModels stay under 100 ms while streams are dropped


def main(port: int, control_port: int) -> None:
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    health, generation = health_pb2_grpc.HealthStub(channel), generation_pb2_grpc.GenerationStub(channel)
    control = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{control_port}"))
    calls = {
        "health": lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=30),
        "list_models": lambda: generation.ListModels(generation_pb2.ListModelsRequest(), timeout=30),
        "control": lambda: control.Check(health_pb2.HealthCheckRequest(), timeout=30),
    }
    for call in calls.values():
        call()  # connected and warm before measuring
    slowest, stop = dict.fromkeys(calls, 0.0), threading.Event()
    rounds = late = 0  # late: the router's slower call passed 100 ms over the control's in that round
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    print("PROBING", flush=True)
    while not stop.wait(0.01):
        took = {}
        for name, call in calls.items():
            began = time.monotonic()
            call()
            took[name] = time.monotonic() - began
            slowest[name] = max(slowest[name], took[name])
        rounds += 1
        late += max(took["health"], took["list_models"]) > BUDGET_S + took["control"]
    print(json.dumps({**slowest, "rounds": rounds, "late_rounds": late}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
