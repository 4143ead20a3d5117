"""A ``baton serve``-style cluster with a generated cluster secret: it serves end to end (the router's
calls carry the secret), while forged ``Prefill`` / ``Reserve`` / ``Release`` calls from a client
without it are refused and the request they aim at finishes with the same tokens as before."""

import grpc
import pytest

from common.cluster_secret import write_cluster_secret
from common.rpc.cluster_secret_interceptor import MISSING
from deploy.local.launcher import LocalCluster
from proto.baton.v1 import generation_pb2, generation_pb2_grpc, workers_pb2, workers_pb2_grpc
from tests.services.routers import scrape

PROMPT = [(11 * i + 5) % 90 + 3 for i in range(40)]  # over --local-prefill-tokens: handed off


def _cluster(model: str, run_folder, role_args: dict | None = None):
    """A one-prefill, one-decode ``LocalCluster`` with a generated cluster secret, and a stub on it."""
    secret_file = write_cluster_secret(run_folder / "cluster-secret")
    cluster = LocalCluster(
        model,
        port=0,
        prefill_workers=1,
        decode_workers=1,
        worker_args=["--batch-invariant", "--dtype", "float32", "--grace-period", "0"],
        role_args=role_args,
        cluster_secret_file=str(secret_file),
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{cluster.port}")
    yield cluster, generation_pb2_grpc.GenerationStub(channel)
    channel.close()
    cluster.stop()


@pytest.fixture(scope="module")
def served(tiny_checkpoint, tmp_path_factory):
    yield from _cluster(str(tiny_checkpoint("k3")), tmp_path_factory.mktemp("run"))


def generate(stub) -> list[generation_pb2.GenerateResponse]:
    sampling = generation_pb2.SamplingParameters(max_tokens=12, ignore_eos=True)
    request = generation_pb2.GenerateRequest(token_ids=generation_pb2.TokenIds(ids=PROMPT), sampling=sampling)
    return stub.Generate(request, timeout=120)


def test_forged_internal_calls_are_refused_and_the_served_output_is_unchanged(served):
    cluster, stub = served
    assert all(worker.config.cluster_secret_file for worker in cluster.workers)
    baseline = list(generate(stub))
    assert baseline[-1].route.transfer_bytes > 0  # handed off: the router reached both workers
    expected = [token for message in baseline for token in message.token_ids]

    stream = generate(stub)
    first = next(stream)
    address = {worker.role: worker.address for worker in cluster.workers}
    with (
        grpc.insecure_channel(address["decode"]) as decode_channel,
        grpc.insecure_channel(address["prefill"]) as prefill_channel,
    ):
        decode = workers_pb2_grpc.DecodeWorkerStub(decode_channel)
        prefill = workers_pb2_grpc.PrefillWorkerStub(prefill_channel)
        forged = [
            lambda: decode.Release(workers_pb2.ReleaseRequest(request_id=first.request_id), timeout=10),
            lambda: list(
                decode.Reserve(workers_pb2.ReserveRequest(request_id="x", prompt_ids=PROMPT), timeout=10)
            ),
            lambda: prefill.Prefill(workers_pb2.PrefillRequest(prompt_ids=PROMPT), timeout=10),
        ]
        for call in forged:
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert (refused.value.code(), refused.value.details()) == (
                grpc.StatusCode.UNAUTHENTICATED,
                MISSING,
            )
    rest = list(stream)
    assert [token for message in [first, *rest] for token in message.token_ids] == expected
    # Nothing leaked: the leak check reaches the workers with their own secret.
    for worker in cluster.workers:
        with worker.channel() as channel:
            stub_class = (
                workers_pb2_grpc.DecodeWorkerStub
                if worker.role == "decode"
                else workers_pb2_grpc.PrefillWorkerStub
            )
            assert stub_class(channel).CheckIntegrity(workers_pb2.IntegrityRequest(), timeout=10).ok


@pytest.fixture(scope="module")
def stray(tiny_checkpoint, tmp_path_factory):
    """The same cluster whose prefill worker follows its first handoff with a stray write into the
    reservation (``--stray-handoff-writes 1``): bytes that are not the prefill's, as a forged write
    over the data plane would leave."""
    run = tmp_path_factory.mktemp("run")
    yield from _cluster(str(tiny_checkpoint("k3")), run, {"prefill": ["--stray-handoff-writes", "1"]})


def test_a_stray_write_into_a_reservation_is_refused_and_the_output_is_unchanged(stray):
    """The decode worker hashes the rows that arrived, finds them unlike the prefill's, frees them and
    prefills the request itself (batch-invariant: the same tokens as the same prompt served again,
    then from the decode worker's own prefix cache)."""
    cluster, stub = stray
    (decode,) = [worker for worker in cluster.workers if worker.role == "decode"]
    metrics_port = int(decode.ready["metrics_port"])
    refused = scrape(metrics_port, "baton_handoff_refused_total", reason="checksum")
    forged = list(generate(stub))
    assert scrape(metrics_port, "baton_handoff_refused_total", reason="checksum") == refused + 1
    clean = list(generate(stub))
    assert forged[-1].route.transfer_bytes > 0  # it was handed off (and the handoff refused)
    assert scrape(metrics_port, "baton_handoff_refused_total", reason="checksum") == refused + 1
    tokens = [[token for message in run for token in message.token_ids] for run in (forged, clean)]
    assert tokens[0] == tokens[1] and len(tokens[0]) == 12
    with decode.channel() as channel:
        stub_class = workers_pb2_grpc.DecodeWorkerStub(channel)
        assert stub_class.CheckIntegrity(workers_pb2.IntegrityRequest(), timeout=10).ok


def test_without_the_handoff_checksum_a_stray_write_goes_unnoticed(tiny_checkpoint, tmp_path):
    """``--no-handoff-checksum`` on the prefill worker turns the check off: the same stray write is
    decoded, no refusal counted (what the flag trades away; docs/authentication.md)."""
    args = {"prefill": ["--stray-handoff-writes", "1", "--no-handoff-checksum"]}
    for cluster, stub in _cluster(str(tiny_checkpoint("k3")), tmp_path, args):
        (decode,) = [worker for worker in cluster.workers if worker.role == "decode"]
        metrics_port = int(decode.ready["metrics_port"])
        messages = list(generate(stub))
        assert messages[-1].route.transfer_bytes > 0  # handed off, stray write and all
        assert scrape(metrics_port, "baton_handoff_refused_total", reason="checksum") == 0
