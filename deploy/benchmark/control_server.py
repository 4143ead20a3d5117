"""An idle gRPC health server in its own process: the control beside a latency measurement.

How long an idle server on the same machine takes to answer at the same moment is what the machine's
own scheduling adds (and the prober's own); whatever a measured server takes beyond that is its own
doing. ``python -m deploy.benchmark.control_server`` prints its port, then serves until its stdin
closes; ``ControlServer`` runs it.
"""

import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2_grpc

REPO = Path(__file__).resolve().parents[2]


class ControlServer:
    """The control server in a child process; ``port`` once started, ``stop()`` ends it."""

    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "deploy.benchmark.control_server"],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.port = int(self.process.stdout.readline())

    def stop(self) -> None:
        self.process.communicate(timeout=30)


def main() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    server.stop(0)


if __name__ == "__main__":
    main()
