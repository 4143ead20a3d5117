"""What the rendered objects mean: the router finds and may reach the workers, probes, GPUs, toggles."""

import json
import math
from pathlib import Path

import pytest
import yaml

from tests.deploy import chart

ROLES = ("prefill", "decode")
COMPONENTS = ("router", *ROLES)
STANDARD_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
)


def _pod_labels(objects: list[dict], component: str) -> dict:
    return chart.one(objects, "Deployment", f"baton-{component}")["spec"]["template"]["metadata"]["labels"]


def _container(objects: list[dict], component: str) -> dict:
    return chart.container(chart.one(objects, "Deployment", f"baton-{component}"))


def _selected(selector: dict, objects: list[dict]) -> list[str]:
    """The components whose pods ``selector`` selects."""
    return [c for c in COMPONENTS if chart.selects(selector, _pod_labels(objects, c))]


@pytest.mark.parametrize("values", list(chart.VALUES))
def test_standard_labels_and_selectors(values):
    objects = chart.render(values)
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert all(key in labels for key in STANDARD_LABELS), obj["metadata"]["name"]
        assert labels["app.kubernetes.io/instance"] == chart.RELEASE
        assert obj["metadata"]["namespace"] == chart.NAMESPACE
    for workload in chart.find(objects, "Deployment"):
        pod = workload["spec"]["template"]["metadata"]["labels"]
        assert chart.selects(workload["spec"]["selector"], pod)
        assert "app.kubernetes.io/version" not in workload["spec"]["selector"]["matchLabels"]  # immutable
    for component in COMPONENTS:
        assert _pod_labels(objects, component)["app.kubernetes.io/component"] == component


def test_router_discovers_the_workers_by_its_selectors():
    """--prefill-selector / --decode-selector pick exactly that role's pods and its headless Service."""
    objects = chart.render("gpu")
    router = _container(objects, "router")
    flags = chart.args(router)
    assert flags[""] == "router"
    assert flags["--discovery"] == "kubernetes"
    assert flags["--namespace"] == "$(POD_NAMESPACE)"
    assert chart.env(router)["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    for role in ROLES:
        selector = chart.parse_selector(flags[f"--{role}-selector"])
        assert selector["matchLabels"] == {
            "app.kubernetes.io/instance": chart.RELEASE,
            "app.kubernetes.io/component": role,
        }
        assert _selected(selector, objects) == [role]
        service = chart.one(objects, "Service", f"baton-{role}")
        assert service["spec"]["clusterIP"] == "None"  # headless: one endpoint per pod
        assert chart.selects(selector, service["metadata"]["labels"])  # copied onto its EndpointSlices
        assert chart.selects({"matchLabels": service["spec"]["selector"]}, _pod_labels(objects, role))
        assert [p["name"] for p in service["spec"]["ports"]] == ["grpc", "metrics"]  # --port-name grpc


def test_router_service_account_has_the_discovery_rbac():
    objects = chart.render()
    pod = chart.one(objects, "Deployment", "baton-router")["spec"]["template"]["spec"]
    account = pod["serviceAccountName"]
    assert chart.one(objects, "ServiceAccount", account)
    (binding,) = chart.find(objects, "RoleBinding")
    assert {"kind": "ServiceAccount", "name": account, "namespace": chart.NAMESPACE} in binding["subjects"]
    assert binding["roleRef"]["kind"] == "Role"
    role = chart.one(objects, "Role", binding["roleRef"]["name"])
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    for group, resource in (("", "pods"), ("", "endpoints"), ("discovery.k8s.io", "endpointslices")):
        for verb in ("get", "list", "watch"):
            assert (group, resource, verb) in granted
    assert all(verb in ("get", "list", "watch") for _, _, verb in granted)  # read-only
    for role_name in ROLES:  # workers never talk to the API
        spec = chart.one(objects, "Deployment", f"baton-{role_name}")["spec"]["template"]["spec"]
        assert spec["automountServiceAccountToken"] is False


def test_network_policy_lets_only_the_router_and_scrapers_reach_the_workers():
    objects = chart.render()
    for role in ROLES:
        policy = chart.one(objects, "NetworkPolicy", f"baton-{role}")["spec"]
        assert _selected(policy["podSelector"], objects) == [role]
        assert policy["policyTypes"] == ["Ingress"]
        grpc_from, peers, metrics_from = policy["ingress"]
        # The router, on the gRPC port only.
        assert grpc_from["ports"] == [{"port": "grpc", "protocol": "TCP"}]
        (router_peer,) = grpc_from["from"]
        assert _selected(router_peer["podSelector"], objects) == ["router"]
        # Other workers of the release on any port (NIXL/UCX handoffs), never the router.
        (worker_peer,) = peers["from"]
        assert "ports" not in peers
        assert _selected(worker_peer["podSelector"], objects) == ["prefill", "decode"]
        # Prometheus, on the metrics port only.
        assert metrics_from["ports"] == [{"port": "metrics", "protocol": "TCP"}]
        assert metrics_from["from"][0]["podSelector"]["matchLabels"] == {
            "app.kubernetes.io/name": "prometheus"
        }
    names = [p["name"] for p in _container(objects, "prefill")["ports"]]
    assert names == ["grpc", "metrics"]  # the named ports the policy refers to


@pytest.mark.parametrize("values", list(chart.VALUES))
def test_probes_are_grpc_health_on_the_grpc_port(values):
    objects = chart.render(values)
    for component in COMPONENTS:
        deployment = chart.one(objects, "Deployment", f"baton-{component}")
        c = chart.container(deployment)
        (grpc_port,) = [p["containerPort"] for p in c["ports"] if p["name"] == "grpc"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["grpc"] == {"port": grpc_port}, (component, probe)
        if component == "router":
            assert f"--port={grpc_port}" in c["args"]
            drain = float(chart.args(c)["--grace-period"])
        else:  # a worker's port and drain are in its config file
            config = chart.worker_config(objects, component)
            assert config["port"] == grpc_port
            drain = float(config["grace_period_s"])
        # Drain: a preStop sleep, then the process's own drain (--grace-period), inside a longer grace
        # period (SIGKILL would cut the drain short).
        sleep = c["lifecycle"]["preStop"]["exec"]["command"]
        assert sleep[0] == "sleep"
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace > int(sleep[1]) + drain, component


def _gpus(objects, role):
    return _container(objects, role)["resources"]["limits"].get("nvidia.com/gpu")


def test_gpu_values_request_gpus_from_the_parallel_layout():
    values = yaml.safe_load(chart.VALUES["gpu"][0].read_text())
    objects = chart.render("gpu")
    for role in ROLES:
        layout = values[role]["parallel"]
        assert _gpus(objects, role) == math.prod(layout[d] for d in ("tp", "pp", "pcp", "dcp"))
        engine = chart.worker_config(objects, role)["engine"]
        assert {d: engine[d] for d in layout} == layout  # the worker reads its degrees from its config
        pod = chart.one(objects, "Deployment", f"baton-{role}")["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == values[role]["nodeSelector"]
        assert pod["tolerations"] == values[role]["tolerations"]
    assert _gpus(chart.render("gpu", "--set", "decode.gpus=16"), "decode") == 16  # explicit count wins
    assert "nvidia.com/gpu" not in _container(objects, "router")["resources"].get("limits", {})


def test_cpu_values_request_no_gpus():
    objects = chart.render("minimal")
    for role in ROLES:
        assert _gpus(objects, role) is None
        assert chart.worker_config(objects, role)["engine"]["device"] == "cpu"
    assert _container(objects, "router")["image"] == "baton:0.1.0-cpu"


@pytest.mark.parametrize("values", ["default", "minimal"])
def test_disabled_features_render_nothing(values):
    objects = chart.render(values)
    kinds = {o["kind"] for o in objects}
    assert not kinds & {"ServiceMonitor", "PrometheusRule"}
    # The only ConfigMaps: each worker role's config file.
    assert [o["metadata"]["name"] for o in chart.find(objects, "ConfigMap")] == [
        "baton-prefill-config",
        "baton-decode-config",
    ]
    assert not [o for o in objects if o["metadata"]["labels"]["app.kubernetes.io/component"] == "redis"]
    for component in COMPONENTS:
        assert "BATON_REDIS_URL" not in chart.env(_container(objects, component))
    assert "--redis-url" not in chart.args(_container(objects, "router"))
    assert all("redis_url" not in chart.worker_config(objects, role) for role in ROLES)
    if values == "minimal":  # network policies and the router's PDB are off in this file
        assert "NetworkPolicy" not in kinds
        assert [p["metadata"]["name"] for p in chart.find(objects, "PodDisruptionBudget")] == [
            "baton-prefill",
            "baton-decode",
        ]
    switches = ["rbac.create", "serviceAccount.create", "networkPolicy.enabled"]
    switches += [f"{component}.podDisruptionBudget.enabled" for component in COMPONENTS]
    off = chart.render(values, *(arg for key in switches for arg in ("--set", f"{key}=false")))
    assert {o["kind"] for o in off} == {"ConfigMap", "Deployment", "Secret", "Service"}  # Secret: cluster's


def test_pod_disruption_budgets_cover_each_component():
    objects = chart.render()
    for component in COMPONENTS:
        pdb = chart.one(objects, "PodDisruptionBudget", f"baton-{component}")["spec"]
        assert _selected(pdb["selector"], objects) == [component]
        assert pdb["maxUnavailable"] == 1


def _uses_redis(objects: list[dict], url: str) -> None:
    """Every process gets ``url``: the router as --redis-url (the cluster index it scores workers by),
    the workers in their config file (redis_url), with their node's name (the index's key)."""
    for component in COMPONENTS:
        assert chart.env(_container(objects, component))["BATON_REDIS_URL"] == url
    assert chart.args(_container(objects, "router"))["--redis-url"] == url
    for role in ROLES:
        assert chart.worker_config(objects, role)["redis_url"] == url
        node = chart.env(_container(objects, role))["BATON_WORKER_NODE"]
        assert node == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_in_chart_redis_is_every_process_cache_tier():
    objects = chart.render("gpu")
    service = chart.one(objects, "Service", "baton-redis")
    url = f"redis://baton-redis:{service['spec']['ports'][0]['port']}/0"
    _uses_redis(objects, url)
    redis = _container(objects, "redis")
    assert redis["image"] == "redis:7"
    policy = chart.one(objects, "NetworkPolicy", "baton-redis")["spec"]
    peers = policy["ingress"][0]["from"][0]["podSelector"]
    assert _selected(peers, objects) == list(COMPONENTS)


@pytest.mark.parametrize(
    "address, url",
    [
        ("cache.example:6379", "redis://cache.example:6379/0"),
        ("rediss://cache:6380/2", "rediss://cache:6380/2"),
    ],
    ids=["host-port", "url"],
)
def test_external_redis_address(address, url):
    objects = chart.render("default", "--set", f"redis.external.address={address}")
    assert not chart.find(objects, "Deployment", "baton-redis")
    _uses_redis(objects, url)


def test_monitoring_objects_carry_the_canonical_files():
    objects = chart.render("gpu")
    monitor = chart.one(objects, "ServiceMonitor", "baton")["spec"]
    assert monitor["jobLabel"] == "app.kubernetes.io/component"  # job = router / prefill / decode
    assert monitor["endpoints"][0]["port"] == "metrics"
    scraped = [
        s
        for s in chart.find(objects, "Service")
        if chart.selects(monitor["selector"], s["metadata"]["labels"])
    ]
    names = sorted(s["metadata"]["name"] for s in scraped)  # the gpu file runs HiCache tiers too
    assert names == ["baton-decode", "baton-hicache", "baton-prefill", "baton-router"]
    assert all("metrics" in [p["name"] for p in s["spec"]["ports"]] for s in scraped)

    rule = chart.one(objects, "PrometheusRule", "baton")
    canonical = sorted(
        (p for p in (chart.REPO / "deploy" / "prometheus").rglob("*.y*ml") if "groups" in (_load(p) or {})),
        key=lambda p: p.name,
    )
    assert canonical, "no Prometheus rule files under deploy/prometheus"
    assert rule["spec"]["groups"] == [group for path in canonical for group in _load(path)["groups"]]

    dashboards = chart.one(objects, "ConfigMap", "baton-dashboards")
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    canonical = {
        p.name: json.loads(p.read_text()) for p in (chart.REPO / "deploy" / "grafana").glob("*.json")
    }
    assert "baton.json" in canonical
    assert {name: json.loads(text) for name, text in dashboards["data"].items()} == canonical


def _load(path: Path):
    return yaml.safe_load(path.read_text())


def test_default_image_is_this_project_at_the_chart_app_version():
    chart_meta = yaml.safe_load((chart.CHART / "Chart.yaml").read_text())
    objects = chart.render()
    for component in COMPONENTS:
        image = _container(objects, component)["image"]
        assert image == f"baton:{chart_meta['appVersion']}"


@pytest.mark.parametrize("values", list(chart.VALUES))
def test_baton_command_accepts_the_rendered_arguments(values):
    """The args the chart renders parse with `baton`'s own parser, and the router's make a valid config."""
    from cli import router_command
    from cli.main import build_parser

    objects = chart.render(values)
    for component in COMPONENTS:
        argv = _container(objects, component)["args"]
        try:
            parsed = build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"baton rejects the {component} arguments {argv}")
        if component == "router":
            config = router_command.config_from(parsed)
            assert config.discovery == "kubernetes"
            assert config.port_name == "grpc"  # the workers' port name in their Services and pods
        else:  # --config names the ConfigMap's file, mounted where the args say
            assert chart.args(_container(objects, component))["--config"] == "/etc/baton/worker.yaml"
            assert parsed.config == Path("/etc/baton/worker.yaml")
