"""A real Prometheus scrapes a local cluster with Baton's rules loaded: after a few requests the
TTFT p99, prefix-hit and transfer-bandwidth recording rules have series, and the TTFT is plausible."""

import json
import math
import re
import shutil
import socket
import subprocess
import time
from urllib.parse import urlencode
from urllib.request import urlopen

import grpc
import pytest
import yaml

from deploy.local.launcher import LocalCluster
from proto.baton.v1 import generation_pb2, generation_pb2_grpc
from tests.observability.exported import RULES, rule_groups

REQUESTS, PROMPT_TOKENS = 10, 40
ALERTS = sum(len(group["rules"]) for group in rule_groups("alerts.rules.yml"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics_port(worker) -> int:
    """The worker's /metrics port, from its ``READY ... metrics_port=N port=M`` line."""
    for line in worker.output:
        if line.startswith("READY "):
            return int(re.search(r"metrics_port=(\d+)", line).group(1))
    raise AssertionError(f"{worker.name}: no READY line in {worker.output}")


def write_config(path, targets: dict[str, list[int]]) -> None:
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES / name) for name in ("recording.rules.yml", "alerts.rules.yml")],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}" for port in ports]}]}
            for job, ports in targets.items()
        ],
    }
    path.write_text(yaml.safe_dump(config))


class Prometheus:
    """``prometheus`` on a free loopback port; ``query`` is its instant-query HTTP API."""

    def __init__(self, config, data, log):
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus not found: apt-get install prometheus (.ci/run installs it)")
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = log
        self.process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
            ],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )
        self.wait(lambda: urlopen(f"{self.url}/-/ready", timeout=1).status == 200, "ready", 20)

    def query(self, promql: str) -> list[tuple[dict, float]]:
        with urlopen(f"{self.url}/api/v1/query?{urlencode({'query': promql})}", timeout=5) as reply:
            body = json.loads(reply.read())
        assert body["status"] == "success", body
        return [(r["metric"], float(r["value"][1])) for r in body["data"]["result"]]

    def evaluated_rules(self) -> list[dict]:
        """Every loaded rule once all have been evaluated without error (else empty)."""
        with urlopen(f"{self.url}/api/v1/rules", timeout=5) as reply:
            groups = json.loads(reply.read())["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        bad = [rule for rule in rules if rule["health"] == "err"]
        assert not bad, bad
        return rules if all(rule["health"] == "ok" for rule in rules) else []

    def wait(self, condition, what: str, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"prometheus exited:\n{self.log.read_text()}"
            try:
                if result := condition():
                    return result
            except OSError:
                pass  # not listening yet
            time.sleep(0.25)
        pytest.fail(f"prometheus: {what} not within {timeout_s} s\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=15)


def test_prometheus_scrapes_the_cluster_and_records_the_rules(tiny_checkpoint, tmp_path):
    model = tiny_checkpoint("kimi_linear")
    cluster = LocalCluster(str(model), 0, 1, 1, ["--dtype", "float32"])
    prometheus = None
    try:
        targets = {"router": [cluster.router.metrics_port]}
        for worker in cluster.workers:
            targets.setdefault(worker.role, []).append(metrics_port(worker))
        write_config(tmp_path / "prometheus.yml", targets)
        prometheus = Prometheus(tmp_path / "prometheus.yml", tmp_path / "data", tmp_path / "prometheus.log")
        prometheus.wait(
            lambda: (
                sorted(m["job"] for m, v in prometheus.query("up") if v == 1)
                == ["decode", "prefill", "router"]
            ),
            "all three targets up",
            30,
        )
        with grpc.insecure_channel(f"127.0.0.1:{cluster.port}") as channel:
            stub = generation_pb2_grpc.GenerationStub(channel)
            sampling = generation_pb2.SamplingParameters(max_tokens=8, ignore_eos=True)
            for i in range(REQUESTS):  # distinct prompts, each long enough to be handed off
                ids = [100 + i, *range(1, PROMPT_TOKENS)]
                request = generation_pb2.GenerateRequest(
                    token_ids=generation_pb2.TokenIds(ids=ids), sampling=sampling
                )
                assert list(stub.Generate(request, timeout=60))[-1].finish_reason
                time.sleep(0.2)  # spread over scrapes, so rates see the counters move

        def recorded(promql: str):
            return [(m, v) for m, v in prometheus.query(promql) if not math.isnan(v)]

        ttft = prometheus.wait(
            lambda: recorded('job:baton_time_to_first_token_seconds:p99_rate5m{job="router"}'), "TTFT p99", 20
        )
        assert 0 < ttft[0][1] < 60, ttft
        hits = prometheus.wait(lambda: recorded("job:baton_prefix_cache_hit:ratio_rate5m"), "prefix hits", 10)
        assert {m["job"] for m, _ in hits} == {"router"} and 0 <= hits[0][1] <= 1, hits
        bandwidth = prometheus.wait(
            lambda: recorded("job_backend:baton_transfer_bandwidth_bytes_per_second:ratio_rate5m"),
            "bandwidth",
            10,
        )
        assert all(m["backend"] == "nixl" and v > 0 for m, v in bandwidth), bandwidth
        rules = prometheus.wait(prometheus.evaluated_rules, "every rule evaluated", 10)
        assert sum(rule["type"] == "alerting" for rule in rules) == ALERTS, rules
    finally:
        if prometheus is not None:
            prometheus.stop()
        cluster.stop()
