"""A ``baton serve``-style cluster with internal mutual TLS on every process (router, prefill and decode
workers, the node's HiCache tier): it serves a handed-off request end to end and the workers write its
blocks through to the tier, so every internal channel worked over TLS; the workers' and the tier's ports
refuse a plaintext client."""

import grpc
import pytest

from deploy.local.launcher import LocalCluster
from deploy.local.managed_process import ManagedCache
from proto.baton.v1 import generation_pb2, generation_pb2_grpc, workers_pb2, workers_pb2_grpc
from tests.lifecycle.cluster import wait_until
from tests.router_auth.certificates import make_pki
from tests.services.routers import scrape

PROMPT = [(7 * i + 3) % 90 + 3 for i in range(40)]  # over --local-prefill-tokens: handed off


@pytest.fixture(scope="module")
def served(tiny_checkpoint, tmp_path_factory):
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    cluster = LocalCluster(
        str(tiny_checkpoint("k3")),
        port=0,
        prefill_workers=1,
        decode_workers=1,
        worker_args=["--dtype", "float32", "--grace-period", "0"],
        host_cache=ManagedCache(kv_gib=0.01, kda_gib=0.01, shm_dir=""),
        internal_tls_files=(str(pki.internal_cert), str(pki.internal_key), str(pki.ca)),
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{cluster.port}")  # the public port: not internal TLS
    yield cluster, generation_pb2_grpc.GenerationStub(channel)
    channel.close()
    cluster.stop()


def test_every_internal_channel_works_over_tls_and_refuses_plaintext(served):
    cluster, stub = served
    sampling = generation_pb2.SamplingParameters(max_tokens=4, ignore_eos=True)
    request = generation_pb2.GenerateRequest(token_ids=generation_pb2.TokenIds(ids=PROMPT), sampling=sampling)
    messages = list(stub.Generate(request, timeout=120))
    assert messages[-1].route.transfer_bytes > 0  # handed off: the router reached both workers
    assert sum(len(m.token_ids) for m in messages) == 4
    tier_metrics = int(cluster.host_cache.ready["metrics_port"])
    written = lambda: scrape(tier_metrics, "baton_hicache_pages_used", kind="kv") > 0  # noqa: E731
    wait_until(written, 10, "the workers' write-through to the tier, over TLS")
    for worker in cluster.workers:
        with grpc.insecure_channel(worker.address) as channel:
            with pytest.raises(grpc.RpcError) as refused:
                workers_pb2_grpc.DecodeWorkerStub(channel).CheckIntegrity(
                    workers_pb2.IntegrityRequest(), timeout=10
                )
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        with worker.channel() as channel:  # the launcher's own channel presents the cluster certificate
            stub_class = (
                workers_pb2_grpc.DecodeWorkerStub
                if worker.role == "decode"
                else workers_pb2_grpc.PrefillWorkerStub
            )
            assert stub_class(channel).CheckIntegrity(workers_pb2.IntegrityRequest(), timeout=10).ok
