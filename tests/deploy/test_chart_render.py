"""The chart lints, renders for every values file it ships, and every rendered object fits the API schema.

Bad values are refused at `helm template` time: by values.schema.json (types, enums, minimums,
unknown keys) or, for rules across keys, by the chart's own checks; each message names the key.
"""

import base64
import json

import pytest
import yaml

from tests.deploy import chart
from tests.deploy.k8s_schema import validate

VALUES = list(chart.VALUES)


@pytest.mark.parametrize("values", VALUES)
def test_helm_lint_strict(values):
    files = [arg for path in chart.VALUES[values] for arg in ("-f", str(path))]
    result = chart.helm("lint", "--strict", str(chart.CHART), *files)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", VALUES)
def test_every_rendered_object_fits_the_api_schema(values):
    objects = chart.render(values)
    errors = [error for obj in objects for error in validate(obj)]
    assert errors == []
    kinds = {obj["kind"] for obj in objects}
    assert {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding"} <= kinds


def test_gpu_values_render_every_kind_the_chart_has():
    """The GPU file turns every optional part on, so the schema check above sees all templates."""
    kinds = {obj["kind"] for obj in chart.render("gpu")}
    assert kinds == {
        "ConfigMap",
        "DaemonSet",
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "PrometheusRule",
        "Role",
        "RoleBinding",
        "Secret",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    }


# Each mistake in tests/deploy/values-bad.yaml, as helm's schema check reports it.
BAD_VALUE_MESSAGES = {
    "unknown-key": "additional properties 'prefil' not allowed",
    "enum": "at '/image/pullPolicy': value must be one of 'Always', 'IfNotPresent', 'Never'",
    "minimum": "at '/router/replicas': minimum: got -1, want 0",
    "type": "at '/router/ports/grpc': got string, want integer",
    "role-enum": "at '/prefill/device': value must be one of 'cuda', 'cpu'",
    "parallel-minimum": "at '/prefill/parallel/tp': minimum: got 0, want 1",
    "gpu-in-resources": "at '/decode/resources/limits/nvidia.com~1gpu': value must be 'not here: GPUs",
}


@pytest.mark.parametrize("command", ["template", "lint"])
def test_bad_values_file_fails_with_the_schema_message(command):
    if command == "template":
        output = chart.render_error("default", "-f", str(chart.BAD_VALUES))
    else:
        result = chart.helm("lint", "--strict", str(chart.CHART), "-f", str(chart.BAD_VALUES))
        assert result.returncode != 0
        output = result.stdout + result.stderr
    assert "values don't meet the specifications of the schema" in output
    missing = {case: message for case, message in BAD_VALUE_MESSAGES.items() if message not in output}
    assert missing == {}, output


SET_MISTAKES = {
    "missing-required": (["--set", "router.replicas=null"], "at '/router': missing property 'replicas'"),
    "redis-address": (["--set", "redis.external.address=redis"], "at '/redis/external/address'"),
    "scrape-interval": (
        ["--set", "metrics.serviceMonitor.interval=15"],
        "at '/metrics/serviceMonitor/interval'",
    ),
    "volume-two-sources": (
        ["--set-json", 'model.volume={"hostPath": {"path": "/m"}, "emptyDir": {}}'],
        "at '/model/volume': maxProperties: got 2, want 1",
    ),
    "volume-unknown-source": (["--set-json", 'model.volume={"hostpath": {}}'], "'hostpath' not allowed"),
    "quantity": (["--set", "prefill.resources.limits.memory=8GB"], "at '/prefill/resources/limits/memory'"),
    "env-shape": (["--set-json", 'decode.extraEnv=[{"name": "A", "val": "1"}]'], "'val' not allowed"),
    "tenant-rate": (
        ["--set", "router.admission.tenantRateLimit=0"],
        "at '/router/admission/tenantRateLimit'",
    ),
    "tenant-burst": (["--set", "router.admission.tenantBurst=0"], "at '/router/admission/tenantBurst'"),
    "max-n": (["--set", "router.maxN=0"], "at '/router/maxN'"),
}


@pytest.mark.parametrize("case", SET_MISTAKES, ids=list(SET_MISTAKES))
def test_schema_refuses(case):
    flags, message = SET_MISTAKES[case]
    error = chart.render_error("default", *flags)
    assert message in error, error


CROSS_KEY_MISTAKES = {
    "worker-grace": (
        ["--set", "decode.terminationGracePeriodSeconds=250"],
        "decode.terminationGracePeriodSeconds (250) must exceed decode.preStopSleepSeconds + "
        "decode.drainSeconds (15 + 240)",
    ),
    "router-grace": (
        ["--set", "router.terminationGracePeriodSeconds=30"],
        "router.terminationGracePeriodSeconds (30) must exceed router.preStopSleepSeconds + "
        "router.drainSeconds (10 + 40)",
    ),
    "two-redis": (
        ["--set", "redis.enabled=true", "--set", "redis.external.address=cache:6379"],
        "set either redis.enabled (an in-chart Redis) or redis.external.address, not both",
    ),
    "no-model-volume": (
        ["--set", "model.claimName="],
        "model.claimName or model.volume: say where the checkpoint is",
    ),
    "gpus-on-cpu": (
        ["--set", "prefill.device=cpu", "--set", "prefill.gpus=2"],
        "prefill.gpus is set but prefill.device is cpu",
    ),
    "ep-not-dividing": (
        ["--set", "decode.parallel.tp=2", "--set", "decode.parallel.ep=4"],
        "decode.parallel.ep (4) must divide decode.parallel.tp x dcp (2 x 1)",
    ),
    "fewer-gpus-than-ranks": (
        ["--set", "decode.parallel.tp=4", "--set", "decode.gpus=2"],
        "decode.gpus (2) is fewer than the decode.parallel ranks (tp x pp x pcp x dcp = 4)",
    ),
}


@pytest.mark.parametrize("case", CROSS_KEY_MISTAKES, ids=list(CROSS_KEY_MISTAKES))
def test_chart_checks_across_keys(case):
    flags, message = CROSS_KEY_MISTAKES[case]
    assert message in chart.render_error("default", *flags)


@pytest.mark.parametrize(
    "values, expect",
    [
        ("default", "kubectl port-forward -n baton svc/baton-router 50051 8000"),
        ("gpu", "kubectl get svc -n baton baton-router -o jsonpath='{.status.loadBalancer.ingress[0].ip}'"),
    ],
    ids=["cluster-ip", "load-balancer"],
)
def test_notes_say_how_to_reach_the_router(values, expect):
    files = [arg for path in chart.VALUES[values] for arg in ("-f", str(path))]
    result = chart.helm("install", "baton", str(chart.CHART), "-n", "baton", "--dry-run=client", *files)
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert expect in notes
    assert "baton-router.baton.svc:50051" in notes
    assert "/v1/completions" in notes


def test_schema_and_default_values_name_the_same_keys():
    """Every default value is typed in values.schema.json, and every schema key has a default
    (Kubernetes objects passed through -- affinity, resources, a volume source -- set only some)."""
    schema = json.loads((chart.CHART / "values.schema.json").read_text())
    values = yaml.safe_load((chart.CHART / "values.yaml").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    passthrough = {"#/definitions/affinity", "#/definitions/resources"}
    mismatched = []

    def walk(node: dict, value, path: str) -> None:
        while "$ref" in node or "allOf" in node:
            if node.get("$ref") in passthrough:
                return
            node = (
                schema["definitions"][node["$ref"].rsplit("/", 1)[1]] if "$ref" in node else node["allOf"][0]
            )
        if not isinstance(value, dict) or "properties" not in node or path == "model.volume":
            return  # a leaf, a map, or one volume source of many
        keys = set(node["properties"]) - {"global"}
        if set(value) != keys:
            mismatched.append(f"{path or '.'}: {sorted(set(value) ^ keys)} in one of values.yaml, the schema")
        for key, item in value.items():
            if key in node["properties"]:
                walk(node["properties"][key], item, f"{path}.{key}" if path else key)

    walk(schema, values, "")
    assert mismatched == []


SECRET_MOUNT = "/var/run/baton/cluster-secret"


@pytest.mark.parametrize("values", ["default", "gpu"])
def test_every_pod_mounts_the_cluster_secret_and_passes_its_flag(values):
    objects = chart.render(values)
    (secret,) = [o for o in objects if o["kind"] == "Secret"]
    assert secret["metadata"]["name"] == "baton-cluster-secret"
    assert len(base64.b64decode(secret["data"]["cluster-secret"])) >= 32
    pods = {o["metadata"]["name"]: o for o in objects if o["kind"] in ("Deployment", "DaemonSet")}
    expected = {"baton-router", "baton-prefill", "baton-decode"} | (
        {"baton-hicache"} if values == "gpu" else set()
    )
    assert expected <= set(pods)
    for name in expected:
        spec = pods[name]["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["cluster-secret"]["secret"]["secretName"] == "baton-cluster-secret", name
        (container,) = spec["containers"]
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert mounts["cluster-secret"] == {
            "name": "cluster-secret",
            "mountPath": SECRET_MOUNT,
            "readOnly": True,
        }
        assert f"--cluster-secret-file={SECRET_MOUNT}/cluster-secret" in container["args"], name


def test_the_cluster_secret_comes_from_a_value_or_the_schema_refuses_it():
    given = "v" * 40
    (secret,) = [
        o for o in chart.render("default", "--set", f"clusterSecret.value={given}") if o["kind"] == "Secret"
    ]
    assert base64.b64decode(secret["data"]["cluster-secret"]).decode() == given
    short = chart.helm(*chart.template_args("default", ("--set", "clusterSecret.value=short")))
    assert short.returncode != 0 and "at '/clusterSecret/value': minLength: got 5, want 32" in short.stderr


def test_the_router_gets_the_tenant_rate_limit_only_when_set():
    def router_args(*flags):
        objects = chart.render("default", *flags)
        return chart.one(objects, "Deployment", "baton-router")["spec"]["template"]["spec"]["containers"][0][
            "args"
        ]

    assert not [a for a in router_args() if a.startswith("--tenant-")]
    limited = router_args(
        "--set-json", "router.admission.tenantRateLimit=2.5", "--set", "router.admission.tenantBurst=10"
    )
    assert "--tenant-rate-limit=2.5" in limited and "--tenant-burst=10" in limited
    assert not [a for a in router_args() if a.startswith("--max-n")]
    assert "--max-n=4" in router_args("--set", "router.maxN=4")


TLS_MOUNT = "/var/run/baton/internal-tls"
TLS_FLAGS = [
    f"--internal-tls-cert={TLS_MOUNT}/tls.crt",
    f"--internal-tls-key={TLS_MOUNT}/tls.key",
    f"--internal-tls-ca={TLS_MOUNT}/ca.crt",
]


def test_internal_tls_mounts_its_secret_passes_its_flags_and_probes_over_it():
    objects = chart.render("gpu", "--set", "internalTls.enabled=true", "--set", "internalTls.secretName=tls")
    validate(objects)
    for name in ("baton-router", "baton-prefill", "baton-decode", "baton-hicache"):
        kind = "DaemonSet" if name == "baton-hicache" else "Deployment"
        spec = chart.one(objects, kind, name)["spec"]["template"]["spec"]
        assert {v["name"]: v for v in spec["volumes"]}["internal-tls"]["secret"]["secretName"] == "tls", name
        (container,) = spec["containers"]
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert mounts["internal-tls"] == {"name": "internal-tls", "mountPath": TLS_MOUNT, "readOnly": True}
        assert all(flag in container["args"] for flag in TLS_FLAGS), name
        probe = container["readinessProbe"]
        if name == "baton-router":  # its probed port is the public one: not internal TLS
            assert "grpc" in probe, name
        else:  # Kubernetes' gRPC probe has no client certificate: the exec probe checks health over TLS
            command = probe["exec"]["command"]
            assert command[:3] == ["python", "-m", "common.rpc.health_probe"] and command[4:] == TLS_FLAGS, (
                name
            )
    plain = chart.render("gpu")
    spec = chart.one(plain, "Deployment", "baton-decode")["spec"]["template"]["spec"]
    assert "internal-tls" not in {v["name"] for v in spec["volumes"]}
    assert "grpc" in spec["containers"][0]["readinessProbe"]
    refused = chart.helm(*chart.template_args("default", ("--set", "internalTls.enabled=true")))
    assert (
        refused.returncode != 0 and "at '/internalTls/secretName': minLength: got 0, want 1" in refused.stderr
    )
