"""A real router with ``--auth-token-file`` in front of one colocated decode worker, for the tests of
the public API's authentication and its tenant limits."""

import contextlib

import grpc
from grpc_health.v1 import health_pb2_grpc

from proto.baton.v1 import generation_pb2_grpc
from router.server import RouterConfig, RouterServer
from tests.services.workers import running_workers


def colocated_config(model, decode_address: str, token_file, **config) -> RouterConfig:
    """A router config with one colocated decode worker, free ports and ``--auth-token-file``;
    ``config``: more ``RouterConfig`` fields (TLS files, limits)."""
    return RouterConfig(
        model=str(model),
        decode=(decode_address,),
        disaggregation="never",
        port=0,
        http_port=0,
        auth_token_file=str(token_file),
        **config,
    )


@contextlib.contextmanager
def auth_router(model, token_file, **config):
    """The router (``RouterServer``, gRPC and HTTP ports picked free) with its ``stub`` and
    ``health_stub`` on a plaintext channel and its ``token_file``; ``config``: more ``RouterConfig``
    fields."""
    with running_workers(model, ("decode", "--dtype", "float32")) as (decode,):
        server = RouterServer(colocated_config(model, decode.address, token_file, **config))
        server.token_file = token_file
        channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        server.stub = generation_pb2_grpc.GenerationStub(channel)
        server.health_stub = health_pb2_grpc.HealthStub(channel)
        try:
            yield server
        finally:
            channel.close()
            server.stop()
