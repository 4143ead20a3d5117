"""Running helm and kubectl on the chart from tests: the binaries (installed on first use), render, lint.

Renders are cached per argument list (``helm template`` takes ~0.1 s, but most tests share a few);
each call parses the text again, so a test may change what it gets.
"""

import functools
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "baton"
TOOLS = REPO / "deploy" / "tools"
BAD_VALUES = Path(__file__).with_name("values-bad.yaml")
# The values files the chart ships, by test id: the defaults and the two CI files.
VALUES = {
    "default": (),
    "gpu": (CHART / "ci" / "values-gpu.yaml",),
    "minimal": (CHART / "ci" / "values-minimal.yaml",),
}
RELEASE = "baton"
NAMESPACE = "baton"


@functools.cache
def binary(name: str) -> str:
    """``helm`` or ``kubectl`` from the virtualenv's bin/, installed there first if missing (`make helm`)."""
    path = Path(sys.prefix) / "bin" / name
    if not path.exists():
        subprocess.run(
            [sys.executable, str(TOOLS / "install_helm.py"), "--bin-dir", str(path.parent),
             "--cache", str(REPO / ".cache" / "helm")],
            check=True,
        )  # fmt: skip
    return str(path)


def helm(*args: str) -> subprocess.CompletedProcess:
    """``helm ARGS`` (not checked: tests look at the return code and stderr)."""
    return subprocess.run([binary("helm"), *args], capture_output=True, text=True, timeout=120)


def template_args(values: str = "default", extra: tuple[str, ...] = ()) -> list[str]:
    files = [arg for path in VALUES[values] for arg in ("-f", str(path))]
    return ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, *files, *extra]


@functools.cache
def _template(values: str, extra: tuple[str, ...]) -> subprocess.CompletedProcess:
    return helm(*template_args(values, extra))


def render(values: str = "default", *extra: str) -> list[dict]:
    """The objects ``helm template`` renders for a values file id plus extra flags (``--set ...``)."""
    result = _template(values, extra)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_error(values: str = "default", *extra: str) -> str:
    """The stderr of a ``helm template`` that must fail."""
    result = _template(values, extra)
    assert result.returncode != 0, "helm template succeeded where it should have failed"
    return result.stderr


def find(objects: list[dict], kind: str, name: str | None = None) -> list[dict]:
    """The objects of ``kind`` (named ``name`` when given), in render order."""
    return [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]


def one(objects: list[dict], kind: str, name: str) -> dict:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def container(workload: dict) -> dict:
    """The (only) container of a Deployment's pod template."""
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    return c


def env(c: dict) -> dict[str, object]:
    """A container's env as ``{name: value or valueFrom}``."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def args(c: dict) -> dict[str, str]:
    """A container's ``--flag=value`` arguments as a dict (the subcommand under key ``""``)."""
    parsed = {"": c["args"][0]}
    for arg in c["args"][1:]:
        flag, _, value = arg.partition("=")
        parsed[flag] = value
    return parsed


def worker_config_text(objects: list[dict], role: str) -> str:
    """The ``worker.yaml`` a worker role's pods read (``baton worker --config``), from its ConfigMap."""
    return one(objects, "ConfigMap", f"{RELEASE}-{role}-config")["data"]["worker.yaml"]


def worker_config(objects: list[dict], role: str) -> dict:
    """A worker role's config file, parsed (``engine`` nested)."""
    return yaml.safe_load(worker_config_text(objects, role))


def selects(selector: dict, labels: dict) -> bool:
    """Whether a LabelSelector (matchLabels, matchExpressions In/NotIn/Exists) selects ``labels``."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def parse_selector(text: str) -> dict:
    """``"a=b,c=d"`` (the router's --prefill-selector form) as a LabelSelector."""
    return {"matchLabels": dict(part.split("=", 1) for part in text.split(","))}
