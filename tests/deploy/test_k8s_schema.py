"""The offline schema check itself: each kind of mistake is caught and named by its path."""

import copy

import pytest

from tests.deploy.k8s_schema import validate

DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "w", "labels": {"app.kubernetes.io/name": "baton"}},
    "spec": {
        "replicas": 1,
        "selector": {"matchLabels": {"app": "w"}},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "25%"}},
        "template": {
            "metadata": {"labels": {"app": "w"}},
            "spec": {
                "containers": [
                    {
                        "name": "w",
                        "image": "baton:0.1.0",
                        "args": ["worker", "--port=50061"],
                        "env": [{"name": "BATON_TP", "value": "8"}],
                        "ports": [{"name": "grpc", "containerPort": 50061}],
                        "readinessProbe": {"grpc": {"port": 50061}, "periodSeconds": 5},
                        "resources": {
                            "limits": {"nvidia.com/gpu": 8, "memory": "128Gi"},
                            "requests": {"cpu": 0.5},
                        },
                    }
                ],
                "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}],
            },
        },
    },
}
C = ("spec", "template", "spec", "containers", 0)
CPATH = "spec.template.spec.containers[0]"


def _set(obj: dict, path: tuple, value) -> dict:
    obj = copy.deepcopy(obj)
    target = obj
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return obj


_DELETE = object()

MISTAKES = {
    "unknown-field": (C + ("bogus",), 1, f"{CPATH}.bogus: unknown field for V1Container"),
    "unknown-nested-field": (C + ("readinessProbe", "grpc", "path"), "/", "grpc.path: unknown field"),
    "string-for-int": (
        C + ("ports", 0, "containerPort"),
        "50061",
        "containerPort: expected int, got a string",
    ),
    "int-for-string": (C + ("env", 0, "value"), 8, "env[0].value: expected str, got int 8"),
    "bool-for-int": (("spec", "replicas"), True, "spec.replicas: expected int, got a boolean"),
    "dict-for-list": (C + ("args",), {"a": 1}, f"{CPATH}.args: expected a list, got an object"),
    "list-for-dict": (C + ("resources",), [], f"{CPATH}.resources: expected an object"),
    "missing-required": (C + ("name",), _DELETE, f"{CPATH}.name: required by V1Container, missing"),
    "missing-required-nested": (C + ("readinessProbe", "grpc", "port"), _DELETE, "grpc.port: required"),
    "bad-quantity": (C + ("resources", "limits", "memory"), "128GB", "'128GB' is not a Kubernetes quantity"),
    "bad-int-or-string": (
        ("spec", "strategy", "rollingUpdate", "maxSurge"),
        [1],
        "expected an integer or a string",
    ),
    "bad-name": (("metadata", "name"), "Worker_1", "metadata.name: 'Worker_1' is not an RFC 1123 label"),
    "bad-label-value": (
        ("metadata", "labels", "app.kubernetes.io/name"),
        "a b",
        "is not a valid label value",
    ),
    "no-name": (("metadata", "name"), _DELETE, "metadata.name: required, missing"),
}


def test_valid_deployment_passes():
    """Quantities as numbers or strings and IntOrString as either are all accepted."""
    assert validate(DEPLOYMENT) == []


@pytest.mark.parametrize("case", MISTAKES, ids=list(MISTAKES))
def test_mistake_is_named_by_path(case):
    path, value, message = MISTAKES[case]
    errors = validate(_set(DEPLOYMENT, path, value))
    assert any(message in e for e in errors), errors
    assert all(e.startswith("Deployment ") for e in errors)


def test_unknown_api_version_is_an_error():
    """A kind under an apiVersion the cluster no longer serves (policy/v1beta1 PDB) has no schema."""
    pdb = {"apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget", "metadata": {"name": "p"}}
    assert validate(pdb) == [
        "PodDisruptionBudget p: no schema for apiVersion 'policy/v1beta1' kind 'PodDisruptionBudget'"
    ]


SERVICE_MONITOR = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "ServiceMonitor",
    "metadata": {"name": "baton"},
    "spec": {"selector": {"matchLabels": {"a": "b"}}, "endpoints": [{"port": "metrics", "interval": "15s"}]},
}
RULE = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "PrometheusRule",
    "metadata": {"name": "baton"},
    "spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up == 0", "for": "5m"}]}]},
}


def test_custom_resources():
    assert validate(SERVICE_MONITOR) == []
    assert validate(RULE) == []
    bad_monitor = _set(SERVICE_MONITOR, ("spec", "endpoints", 0, "intervall"), "15s")
    assert validate(bad_monitor) == ["ServiceMonitor baton: spec.endpoints[0].intervall: unknown field"]
    no_expr = _set(RULE, ("spec", "groups", 0, "rules", 0, "expr"), _DELETE)
    assert validate(no_expr) == ["PrometheusRule baton: spec.groups[0].rules[0].expr: required, missing"]
    both = _set(RULE, ("spec", "groups", 0, "rules", 0, "record"), "job:x:rate5m")
    assert validate(both) == [
        "PrometheusRule baton: spec.groups[0].rules[0]: needs exactly one of record, alert"
    ]
    bad_selector = _set(SERVICE_MONITOR, ("spec", "selector", "matchLabels"), ["a"])
    assert "spec.selector.matchLabels: expected an object (map), got a list" in validate(bad_selector)[0]
