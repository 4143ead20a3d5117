"""deploy/k8s is the chart rendered with its default values, and kustomize builds it."""

import subprocess
import sys

import yaml

from tests.deploy import chart

K8S = chart.REPO / "deploy" / "k8s"


def test_plain_manifests_are_current(tmp_path):
    """Fails after a chart change until `make k8s-manifests` is run."""
    subprocess.run(
        [
            sys.executable,
            str(chart.TOOLS / "render_manifests.py"),
            "--helm",
            chart.binary("helm"),
            "--out",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
    )
    want = {p.name: p.read_text() for p in tmp_path.glob("*.yaml")}
    have = {p.name: p.read_text() for p in K8S.glob("*.yaml")}
    assert sorted(have) == sorted(want), "run `make k8s-manifests`"
    stale = [name for name in want if have[name] != want[name]]
    assert stale == [], f"run `make k8s-manifests`: {stale} differ from the chart"


def test_kustomize_builds_the_same_objects_as_helm():
    built = subprocess.run(
        [chart.binary("kubectl"), "kustomize", str(K8S)], check=True, capture_output=True, text=True
    ).stdout
    objects = [doc for doc in yaml.safe_load_all(built) if doc]
    rendered = [o for o in chart.render() if o["kind"] != "Secret"]  # the cluster secret: made by hand
    key = lambda o: (o["kind"], o["metadata"]["name"], o["metadata"]["namespace"])  # noqa: E731
    assert sorted(map(key, objects)) == sorted(map(key, rendered))
    assert sorted(objects, key=key) == sorted(rendered, key=key)
