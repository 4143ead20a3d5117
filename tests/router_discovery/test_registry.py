"""``discovery_for``: the discovery ``RouterConfig`` names, and errors that name the field to fix."""

import pytest

from router.discovery import StaticDiscovery, discovery_for
from router.discovery.k8s import KubernetesDiscovery
from router.server import RouterConfig


def test_static_reports_its_lists_once_on_start():
    discovery = discovery_for(RouterConfig(model="m", prefill=("p:1",), decode=("d:1", "d:2")))
    assert isinstance(discovery, StaticDiscovery)
    calls = []
    discovery.start(lambda prefill, decode: calls.append((prefill, decode)))
    discovery.stop()
    assert calls == [(["p:1"], ["d:1", "d:2"])]


def test_colocated_static_needs_no_prefill_workers():
    assert discovery_for(RouterConfig(model="m", decode=("d:1",), disaggregation="never")).prefill == []


def test_kubernetes_is_built_from_its_fields(monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    config = RouterConfig(
        model="m", discovery="kubernetes", namespace="ns", prefill_selector="a=p", decode_selector="a=d"
    )
    with pytest.raises(ValueError, match="discovery: no in-cluster service account and no usable kubeconfig"):
        discovery_for(config)  # outside a cluster, without a kubeconfig: a clear error, not a traceback
    built = []  # the fields reach the constructor
    monkeypatch.setattr(KubernetesDiscovery, "__init__", lambda self, *args: built.append(args))
    discovery_for(config)
    assert built == [("ns", "a=p", "a=d", "grpc")]


@pytest.mark.parametrize(
    "fields, words",
    [
        ({}, "decode: static discovery needs at least one decode worker"),
        ({"decode": ("d:1",)}, "prefill: disaggregated serving needs at least one prefill worker"),
        ({"decode": ("d1",), "disaggregation": "never"}, "decode: expected host:port, got 'd1'"),
        ({"decode": ("d:1",), "prefill": ("p:0",)}, "prefill: expected host:port"),
        ({"decode": ("d:1",), "prefill": ("p:1",), "namespace": "ns"}, "namespace: only used with"),
        ({"discovery": "dns"}, "discovery: 'dns' is not one of static, kubernetes"),
        ({"discovery": "kubernetes", "decode": ("d:1",)}, "decode: fixed addresses cannot be combined"),
        ({"discovery": "kubernetes", "namespace": "ns", "decode_selector": "a=d"}, "prefill_selector:"),
    ],
    ids=[
        "no-decode",
        "no-prefill",
        "bad-address",
        "port-zero",
        "namespace-in-static",
        "unknown-kind",
        "kubernetes-with-addresses",
        "kubernetes-without-prefill",
    ],
)
def test_bad_configurations_name_the_field(fields, words):
    with pytest.raises(ValueError, match=words):
        discovery_for(RouterConfig(model="m", **fields))
