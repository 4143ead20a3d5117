"""A gRPC health check from the command line, for Kubernetes exec probes of a port that serves internal
mutual TLS (Kubernetes' own ``grpc`` probe cannot present a client certificate)::

    python -m common.rpc.health_probe 127.0.0.1:50061 --internal-tls-cert C --internal-tls-key K \\
        --internal-tls-ca CA

Exit 0 when ``grpc.health.v1.Health/Check`` answers SERVING, 1 otherwise (the reason on stderr), 2 for
bad flags. Imports only gRPC and ``common``: a probe runs every few seconds.
"""

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.internal_tls import FLAGS, insecure_or_internal_channel, internal_tls
from common.tls_files import TlsFileError


def probe(address: str, tls_files: tuple[str, str, str], timeout_s: float) -> str | None:
    """None when the server at ``address`` says SERVING, else why not.

    Raises:
        TlsFileError: the TLS files (naming the flag).
    """
    with insecure_or_internal_channel(address, internal_tls(*tls_files)) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout_s
            )
        except grpc.RpcError as error:
            return f"{address}: {error.code().name}: {error.details()}"
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return f"{address}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", help="HOST:PORT of the gRPC server")
    for flag in FLAGS:
        parser.add_argument(flag, default="", metavar="FILE")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds (default 2)")
    args = parser.parse_args(argv)
    try:
        failure = probe(
            args.address, (args.internal_tls_cert, args.internal_tls_key, args.internal_tls_ca), args.timeout
        )
    except TlsFileError as error:
        print(f"health_probe: {error}", file=sys.stderr)
        return 2
    if failure is not None:
        print(f"health_probe: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
