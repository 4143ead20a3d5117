"""The cluster secret on a worker's and a ``baton cache``'s gRPC ports: every internal method, read from
the services' descriptors (a new RPC cannot be left out), is refused without the secret or with a wrong
one, and answers with it; the health service stays open."""

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.cluster_secret import METADATA_KEY, write_cluster_secret
from common.rpc.cluster_secret_interceptor import MISSING, WRONG, with_cluster_secret
from proto.baton.v1 import host_cache_pb2, workers_pb2, workers_pb2_grpc
from services.engine.engine_config import EngineConfig
from services.hicache.client import HostCacheClient
from services.hicache.server import CacheConfig, HostCacheServer
from services.worker_config import WorkerConfig
from services.worker_server import WorkerServer

SERVICES = {
    "decode": workers_pb2.DESCRIPTOR.services_by_name["DecodeWorker"],
    "prefill": workers_pb2.DESCRIPTOR.services_by_name["PrefillWorker"],
    "cache": host_cache_pb2.DESCRIPTOR.services_by_name["HostCache"],
}
METHODS = [(owner, method) for owner, service in SERVICES.items() for method in service.methods]


@pytest.fixture(scope="module")
def secured(tiny_checkpoint, tmp_path_factory):
    """A decode worker, a prefill worker and a ``baton cache`` tier, all with one secret."""
    secret_file = write_cluster_secret(tmp_path_factory.mktemp("secret") / "cluster-secret")
    engine = EngineConfig(model=str(tiny_checkpoint("k3")), dtype="float32", num_blocks=32, max_num_seqs=2)
    workers = {
        role: WorkerServer(
            WorkerConfig(
                role=role,
                engine=engine,
                transfer_backend="grpc_bytes",
                cluster_secret_file=str(secret_file),
                grace_period_s=0,
            )
        )
        for role in ("decode", "prefill")
    }
    secret = secret_file.read_text().strip()
    tier = HostCacheServer(
        CacheConfig(
            1 << 20, 0, port=0, transfer_backend="grpc_bytes", shm_dir="", threads=4, cluster_secret=secret
        )
    )
    addresses = {role: f"127.0.0.1:{server.port}" for role, server in workers.items()}
    addresses["cache"] = f"127.0.0.1:{tier.port}"
    channels = {owner: grpc.insecure_channel(address) for owner, address in addresses.items()}
    yield secret, addresses, channels
    for channel in channels.values():
        channel.close()
    for server in workers.values():
        server.stop(grace_s=0)
    tier.stop(grace_s=0)


def call(channel: grpc.Channel, owner: str, method, metadata=()):
    """``method`` with an empty request (raw bytes: nothing is parsed on this side), its stream read."""
    path = f"/{SERVICES[owner].full_name}/{method.name}"
    shape = ("stream" if method.client_streaming else "unary") + "_"
    shape += "stream" if method.server_streaming else "unary"
    stub = getattr(channel, shape)(path)
    request = iter([b""]) if method.client_streaming else b""
    reply = stub(request, timeout=10, metadata=metadata)
    if method.server_streaming:
        return list(reply)
    return reply


@pytest.mark.parametrize(("owner", "method"), METHODS, ids=[f"{o}-{m.name}" for o, m in METHODS])
@pytest.mark.parametrize("presented", ["none", "wrong", "two"])
def test_every_internal_method_refuses_a_call_without_the_secret(secured, owner, method, presented):
    secret, _, channels = secured
    metadata = {
        "none": (),
        "wrong": ((METADATA_KEY, "x" * len(secret)),),
        "two": ((METADATA_KEY, "x" * len(secret)), (METADATA_KEY, secret)),  # one wrong value is enough
    }[presented]
    with pytest.raises(grpc.RpcError) as refused:
        call(channels[owner], owner, method, metadata)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert refused.value.details() == (MISSING if presented == "none" else WRONG)
    assert secret not in refused.value.details()


def test_the_secret_opens_every_service_and_health_stays_open(secured):
    secret, addresses, channels = secured
    for role, stub_class in (
        ("decode", workers_pb2_grpc.DecodeWorkerStub),
        ("prefill", workers_pb2_grpc.PrefillWorkerStub),
    ):
        stub = stub_class(with_cluster_secret(channels[role], secret))
        assert stub.CheckIntegrity(workers_pb2.IntegrityRequest(), timeout=10).ok
        assert stub.Stats(workers_pb2.StatsRequest(), timeout=10).worker == f"{role}-0"
        if role == "decode":  # a prompt scored: the secret opens the method, not only its refusal
            assert len(stub.Score(workers_pb2.ScoreRequest(prompt_ids=[5, 6, 7]), timeout=30).logprobs) == 2
    # The worker's own client of the tier sends it: the attach is answered (without: the tier is down).
    client = HostCacheClient(addresses["cache"], cluster_secret=secret)
    assert client.attach("layout-a", 4096, 0) is not None and client.available
    client.close()
    outsider = HostCacheClient(addresses["cache"])
    assert outsider.attach("layout-a", 4096, 0) is None and not outsider.available
    outsider.close()
    for channel in channels.values():
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_is_refused_without_the_secret(secured):
    _, _, channels = secured
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    stub = reflection_pb2_grpc.ServerReflectionStub(channels["decode"])
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    with pytest.raises(grpc.RpcError) as refused:
        list(stub.ServerReflectionInfo(iter([request]), timeout=10))
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
