"""Internal mutual TLS between a cluster's processes (``common/internal_tls.py``): a worker started with
``--internal-tls-cert/-key/-ca`` serves its internal port over TLS and takes only clients whose
certificate the cluster CA signed (a plaintext client and one with a stranger CA's certificate are
refused, whatever they send); a router with the same flags routes to it (checking the worker's
certificate by ``baton-internal``, not its address), a router without them cannot. The flags are all or
none, and bad files are errors naming the flag."""

import json

import grpc
import pytest

from cli.main import main as cli_main
from common.internal_tls import internal_tls
from common.rpc import health_probe
from common.tls_files import TlsFileError
from proto.baton.v1 import generation_pb2, workers_pb2, workers_pb2_grpc
from tests.router_auth.certificates import make_pki
from tests.services.routers import router_factory
from tests.services.workers import WorkerProcess


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def flags(pki) -> dict[str, str]:
    return {
        "internal_tls_cert": str(pki.internal_cert),
        "internal_tls_key": str(pki.internal_key),
        "internal_tls_ca": str(pki.ca),
    }


@pytest.fixture(scope="module")
def worker(tiny_checkpoint, pki):
    args = [f"--{name.replace('_', '-')}={path}" for name, path in flags(pki).items()]
    process = WorkerProcess("decode", tiny_checkpoint("k3"), "--dtype", "float32", *args)
    yield process
    process.stop()


def integrity(channel: grpc.Channel) -> workers_pb2.PoolIntegrity:
    with channel:
        stub = workers_pb2_grpc.DecodeWorkerStub(channel)
        return stub.CheckIntegrity(workers_pb2.IntegrityRequest(), timeout=10)


def test_only_clients_with_a_cluster_certificate_get_in(worker, pki):
    tls = internal_tls(**{name.removeprefix("internal_tls_"): path for name, path in flags(pki).items()})
    assert integrity(tls.channel(worker.address)).ok  # checked as baton-internal, dialled as 127.0.0.1
    stranger = internal_tls(str(pki.stranger_internal_cert), str(pki.stranger_internal_key), str(pki.ca))
    for refused in (grpc.insecure_channel(worker.address), stranger.channel(worker.address)):
        with pytest.raises(grpc.RpcError) as failure:
            integrity(refused)
        assert failure.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_router_with_the_cluster_certificate_routes_there_and_one_without_cannot(
    tiny_checkpoint, worker, pki
):
    request = generation_pb2.GenerateRequest(
        token_ids=generation_pb2.TokenIds(ids=[5, 6, 7, 8]),
        sampling=generation_pb2.SamplingParameters(max_tokens=3, ignore_eos=True),
    )
    with router_factory(tiny_checkpoint("k3"), disaggregation="never") as make:
        secured = make([], [worker], **flags(pki))
        tokens = [t for m in secured.stub.Generate(request, timeout=60) for t in m.token_ids]
        assert len(tokens) == 3
        plain = make([], [worker])
        with pytest.raises(grpc.RpcError) as failure:
            list(plain.stub.Generate(request, timeout=30))
        assert failure.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"cert": "internal_cert"}, "--internal-tls-key: internal mutual TLS needs all of"),
        ({"key": "internal_key", "ca": "ca"}, "--internal-tls-cert: internal mutual TLS needs all of"),
        (
            {"cert": "internal_cert", "key": "other_key", "ca": "ca"},
            "--internal-tls-key: .* is not the private key",
        ),
        (
            {"cert": "internal_cert", "key": "internal_key", "ca": "internal_key"},
            "--internal-tls-ca: .* no usable PEM",
        ),
        ({"cert": "missing", "key": "internal_key", "ca": "ca"}, "--internal-tls-cert: cannot read"),
    ],
)
def test_the_flags_are_all_or_none_and_checked(pki, given, message):
    paths = {part: str(getattr(pki, name, pki.ca.parent / "missing.pem")) for part, name in given.items()}
    with pytest.raises(TlsFileError, match=message):
        internal_tls(paths.get("cert", ""), paths.get("key", ""), paths.get("ca", ""))
    assert internal_tls("", "", "") is None


def test_the_exec_probe_checks_health_over_internal_tls(worker, pki, capsys):
    """What the chart's probes run when Kubernetes' own gRPC probe cannot present a certificate."""
    files = [f"--{name.replace('_', '-')}={path}" for name, path in flags(pki).items()]
    assert health_probe.main([worker.address, *files]) == 0
    assert health_probe.main([worker.address, "--timeout", "5"]) == 1  # plaintext: refused
    assert "UNAVAILABLE" in capsys.readouterr().err
    assert health_probe.main([worker.address, files[0]]) == 2
    assert "--internal-tls-key: internal mutual TLS needs all of" in capsys.readouterr().err


def test_baton_adapters_reaches_the_worker_over_internal_tls(worker, pki, capsys):
    files = [f"--{name.replace('_', '-')}={path}" for name, path in flags(pki).items()]
    assert cli_main(["adapters", "list", "--worker", worker.address, "--json", *files]) == 0
    assert json.loads(capsys.readouterr().out) == {"adapters": []}
    assert cli_main(["adapters", "list", "--worker", worker.address, "--timeout", "5"]) == 1  # plaintext
    assert "UNAVAILABLE" in capsys.readouterr().out
