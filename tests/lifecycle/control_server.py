"""``python -m tests.lifecycle.control_server``: an idle gRPC health server in its own process, the
control beside a latency measurement. It prints its port, then serves until its stdin closes.

How long an idle server on the same machine takes to answer at the same moment is what the machine's
own scheduling adds; whatever a measured server takes beyond that is its own doing."""

import sys
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2_grpc


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
