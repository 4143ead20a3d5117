"""deploy/prometheus: the rule files are what generate.py writes, promtool accepts them and their unit
tests pass, every alert is tested firing and quiet, and every series they read is exported."""

import importlib.util
import shutil
import subprocess

import pytest
import yaml

from common.metrics import Metrics
from router.server import RouterConfig
from tests.observability.exported import (
    BUILTIN,
    RULES,
    metric_names,
    recording_rules,
    rule_groups,
    series_names,
)

RULE_FILES = ("recording.rules.yml", "alerts.rules.yml")


def generator():
    spec = importlib.util.spec_from_file_location("baton_rules_generator", RULES / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def promtool(*args: str) -> subprocess.CompletedProcess:
    """Run promtool; missing, it fails the test (``.ci/run`` installs Debian's ``prometheus`` package)."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: apt-get install prometheus (.ci/run installs it before make test)")
    return subprocess.run([path, *args], cwd=RULES, capture_output=True, text=True, timeout=120)


def test_rule_files_are_up_to_date():
    for name, text in generator().render().items():
        assert (RULES / name).read_text() == text, f"run: python deploy/prometheus/generate.py ({name})"


def test_slo_targets_are_router_defaults_and_histogram_buckets():
    module, config = generator(), RouterConfig(model="m", prefill=(), decode=())
    assert (module.SLO_TTFT_SECONDS, module.SLO_TPOT_SECONDS) == (config.slo_ttft_s, config.slo_tpot_s)
    buckets = {
        family.name: {s.labels["le"] for s in family.samples if s.name.endswith("_bucket")}
        for family in Metrics("router").registry.collect()
        if family.type == "histogram"
    }
    for short, (_, target) in module.SLOS.items():
        histogram = module.LATENCIES[short]
        assert module._le(target) in buckets[histogram], f"{histogram} has no bucket le={target}"


def test_promtool_check_rules():
    result = promtool("check", "rules", *RULE_FILES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass():
    tests = sorted(str(path.relative_to(RULES)) for path in (RULES / "tests").glob("*.yaml"))
    assert tests, "no promtool unit tests in deploy/prometheus/tests"
    result = promtool("test", "rules", *tests)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(tests), result.stdout


def test_alert_tests_evaluate_every_recording_group_before_the_alerts():
    """Without ``group_eval_order`` promtool orders groups at random, and an alert may read the previous
    step's recorded ratio (a test that passes only sometimes)."""
    recording = [group["name"] for group in rule_groups("recording.rules.yml")]
    alerting = [group["name"] for group in rule_groups("alerts.rules.yml")]
    order = yaml.safe_load((RULES / "tests" / "alerts_test.yaml").read_text())["group_eval_order"]
    assert order == recording + alerting


def test_every_alert_is_tested_firing_and_quiet():
    alerts = {rule["alert"] for group in rule_groups("alerts.rules.yml") for rule in group["rules"]}
    firing, quiet = set(), set()
    for path in (RULES / "tests").glob("*.yaml"):
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", ()):
                (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert sorted(alerts - firing) == [], "alerts no promtool test sees firing"
    assert sorted(alerts - quiet) == [], "alerts no promtool test sees quiet"


def test_rules_read_only_exported_series_and_recorded_names():
    """Every recording rule and alert rests on metrics a process exports (or on other recording rules)."""
    known, recorded = series_names() | BUILTIN, recording_rules()
    for name, expr in recorded.items():
        assert metric_names(expr) - known - set(recorded) == set(), f"recording rule {name}"
        assert name.count(":") == 2, f"{name}: level:metric:operations"
    for group in rule_groups("alerts.rules.yml"):
        for rule in group["rules"]:
            assert metric_names(rule["expr"]) - known - set(recorded) == set(), rule["alert"]
            assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
