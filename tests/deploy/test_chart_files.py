"""The chart's copies of the monitoring files (files/) match their canonical files under deploy/."""

import importlib.util

import pytest

from tests.deploy import chart


def _chart_files_module():
    spec = importlib.util.spec_from_file_location("chart_files", chart.TOOLS / "chart_files.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_chart_copies_match_canonical_files():
    """Fails after an edit to deploy/prometheus or deploy/grafana until `make chart-files` is run."""
    module = _chart_files_module()
    assert module.plan(), "no canonical monitoring files found under deploy/"
    assert module.differences() == [], "run `make chart-files`"


@pytest.fixture
def fake_deploy(tmp_path, monkeypatch):
    """chart_files pointed at a scratch deploy/ with one rule file, one promtool test and a dashboard."""
    module = _chart_files_module()
    deploy = tmp_path / "deploy"
    (deploy / "prometheus" / "tests").mkdir(parents=True)
    (deploy / "grafana").mkdir()
    (deploy / "prometheus" / "alerts.rules.yml").write_text("groups:\n- name: g\n  rules: []\n")
    (deploy / "prometheus" / "tests" / "alerts_test.yaml").write_text("rule_files: [x]\ntests: []\n")
    (deploy / "grafana" / "baton.json").write_text('{"title": "Baton"}\n')
    monkeypatch.setattr(module, "DEPLOY", deploy)
    monkeypatch.setattr(module, "CHART_FILES", deploy / "helm" / "baton" / "files")
    return module, deploy


def test_sync_copies_rule_files_and_dashboards_only(fake_deploy):
    module, deploy = fake_deploy
    files = deploy / "helm" / "baton" / "files"
    copies = "deploy/helm/baton/files"
    assert sorted(module.differences()) == [
        f"{copies}/grafana/baton.json: missing (copy of deploy/grafana/baton.json)",
        f"{copies}/prometheus/rules/alerts.rules.yml: missing (copy of deploy/prometheus/alerts.rules.yml)",
    ]
    module.sync()
    assert sorted(str(p.relative_to(files)) for p in files.rglob("*") if p.is_file()) == [
        "grafana/baton.json",
        "prometheus/rules/alerts.rules.yml",
    ]
    assert module.differences() == []


def test_edits_and_leftovers_are_reported(fake_deploy):
    module, deploy = fake_deploy
    module.sync()
    (deploy / "grafana" / "baton.json").write_text('{"title": "Baton v2"}\n')
    (deploy / "prometheus" / "alerts.rules.yml").unlink()
    assert sorted(module.differences()) == [
        "deploy/helm/baton/files/grafana/baton.json: differs from deploy/grafana/baton.json",
        "deploy/helm/baton/files/prometheus/rules/alerts.rules.yml: stale (no canonical file)",
    ]
    module.sync()
    assert module.differences() == []
