"""``baton loadtest`` end to end: a scaled WEKA agent trace replayed against a local cluster (the
acceptance test), a sweep over HTTP, and the exit statuses for bad input and invalid runs."""

import csv
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli.main import main

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT.parent / "shared" / "traces" / "weka_trace_0182.json"  # ../shared/traces beside the repo
SUMMARY_KEYS = {
    "duration_s", "requests", "tokens", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "output_tokens_per_s",
    "requests_per_s", "goodput_rps", "error_rate", "valid", "cached_token_ratio", "slo", "config", "server",
    "levels",
}  # fmt: skip
FILES = ("summary.json", "requests.csv", "index.html", "latency_cdf.png", "throughput.png", "frontier.png")


def rows(out) -> list[dict]:
    with open(out / "requests.csv") as file:
        return list(csv.DictReader(file))


def weka_trace(tmp_path: Path) -> Path:
    """The real WEKA trace beside the repository, or (in a checkout without ../shared) one written in
    its format: one session whose context grows by 20 blocks a turn over a shared prefix."""
    if TRACE.is_file():
        return TRACE
    requests = [
        {
            "t": 2.0 * turn, "type": "n", "in": 64 * (200 + 20 * turn) + 17, "out": 40,
            "hash_ids": list(range(1, 201 + 20 * turn)), "think_time": 1.0, "api_time": 1.0,
        }
        for turn in range(10)
    ]  # fmt: skip
    path = tmp_path / "weka_trace_test.json"
    path.write_text(
        json.dumps({"id": "trace_test", "block_size": 64, "hash_id_scope": "local", "requests": requests})
    )
    return path


def test_weka_trace_replay_reports_cache_hits(loadtest_cluster, tmp_path, capsys):
    out = tmp_path / "weka"
    status = main([
        "loadtest", "--target", f"grpc://127.0.0.1:{loadtest_cluster.port}",
        "--workload", "trace", "--trace", str(weka_trace(tmp_path)),
        "--scale", "256", "--time-scale", "10000",
        "--concurrency", "1", "--max-requests", "8", "--warmup", "1",
        "--slo-ttft-ms", "5000", "--slo-tpot-ms", "500",
        "--metrics-url", f"http://127.0.0.1:{loadtest_cluster.router.metrics_port}/metrics",
        "--no-progress", "--out", str(out),
    ])  # fmt: skip
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert "concurrency 1" in printed and "report:" in printed
    for name in FILES:
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert summary["valid"] and summary["error_rate"] == 0 and summary["requests"]["completed"] == 7
    records = rows(out)
    assert len(records) == 8 and not any(r["error"] for r in records)
    assert [r["warmup"] for r in records].count("1") == 1
    assert [int(r["turn"]) for r in records] == list(range(8))  # one session, its turns in order
    assert int(records[0]["cached_tokens"]) == 0
    assert all(int(r["cached_tokens"]) > 0 for r in records[2:])  # later turns hit the prefix cache
    server = summary["server"]  # the router's counters moved by exactly what was sent
    assert server["baton_prompt_tokens_total"] == sum(int(r["input_tokens"]) for r in records)
    assert server["baton_cached_prompt_tokens_total"] == sum(int(r["cached_tokens"]) for r in records)
    assert summary["config"]["plan"]["levels"] == [1] and summary["config"]["cancelled_at_end"] == 0


def test_sweep_over_http(loadtest_cluster, tmp_path, capsys):
    out = tmp_path / "sweep"
    status = main([
        "loadtest", "--target", f"http://127.0.0.1:{loadtest_cluster.router.http_port}",
        "--workload", "multiturn", "--sessions", "4", "--turns", "2", "--input-len", "48", "--turn-len", "16",
        "--output-len", "4", "--think-time", "0.05", "--tool-time", "0.05",
        "--sweep", "1,2", "--max-requests", "4", "--no-progress", "--out", str(out),
    ])  # fmt: skip
    assert status == 0, capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    assert [level["concurrency"] for level in summary["levels"]] == [1, 2]
    assert all(level["requests"]["completed"] == 4 for level in summary["levels"])
    assert [w["ended_by"] for w in summary["config"]["windows"]] == ["max_requests"] * 2
    compared = tmp_path / "compared"
    assert main(["loadtest-compare", f"first={out}", f"again={out}", "--out", str(compared)]) == 0
    assert (compared / "frontier.png").read_bytes().startswith(b"\x89PNG")
    assert "again" in (compared / "index.html").read_text()
    assert main(["loadtest-compare", f"missing={tmp_path / 'nothing'}", "--out", str(compared)]) == 2


def test_a_run_with_mostly_errors_exits_1(loadtest_cluster, tmp_path, capsys):
    status = main([
        "loadtest", "--target", f"grpc://127.0.0.1:{loadtest_cluster.port}", "--workload", "synthetic",
        "--sessions", "3", "--input-len", "8", "--output-len", "2", "--vocab", "100000",  # beyond the model's
        "--no-progress", "--out", str(tmp_path / "bad"),
    ])  # fmt: skip
    assert status == 1
    assert "invalid run" in capsys.readouterr().err
    assert all(r["error"].startswith("INVALID_ARGUMENT") for r in rows(tmp_path / "bad"))


def test_ctrl_c_ends_the_run_and_still_writes_the_report(loadtest_cluster, tmp_path):
    out = tmp_path / "interrupted"
    command = [
        sys.executable, "-m", "cli.main", "loadtest", "--target", f"grpc://127.0.0.1:{loadtest_cluster.port}",
        "--workload", "synthetic", "--sessions", "500", "--input-len", "32", "--output-len", "8",
        "--concurrency", "2", "--duration", "60", "--out", str(out),
    ]  # fmt: skip
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        seen = b""
        while b"concurrency 2" not in seen:  # the progress line: the run has started
            byte = process.stderr.read(1)
            assert byte, f"loadtest exited early: {seen.decode(errors='replace')}"
            seen += byte
        time.sleep(2.0)  # a request takes about 0.6 s on a 2-core box (TTFT 0.25 s, TPOT 40 ms): some finish
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, stderr.decode()
    assert b"interrupted" in stderr and b"report:" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["interrupted"] and summary["requests"]["completed"] > 0
    assert summary["requests"]["failed"] == 0  # requests cut short are dropped, not failures


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--target", "ftp://127.0.0.1:1"], "--target"),
        (["--sweep", "1,2"], "--sweep"),
        (["--sweep", "1,x", "--duration", "5"], "--sweep"),
        (["--concurrency", "0"], "--concurrency"),
        (["--turns", "3"], "--turns"),
        (["--burstiness", "2"], "--burstiness"),
        (["--rate", "2", "--arrival", "poisson", "--burstiness", "2"], "--burstiness"),
        (["--max-requests", "0"], "--max-requests"),
        (["--slo-ttft-ms", "-1"], "--slo-ttft-ms"),
        (["--sessions", "0"], "--sessions"),
        (["--metrics-url", "http://127.0.0.1:{port}/metrics"], "--metrics-url"),
    ],
    ids=lambda value: value if isinstance(value, str) else "_".join(value)[:40],
)
def test_bad_input_exits_2_naming_the_flag(tmp_path, capsys, extra, flag):
    port = _free_port()  # nothing listens: nothing may be sent before the input is checked
    args = ["loadtest", "--target", f"grpc://127.0.0.1:{port}", "--workload", "synthetic"]
    args += [a.format(port=port) for a in extra] + ["--no-progress", "--out", str(tmp_path)]
    assert main(args) == 2
    assert f"baton loadtest: error: {flag}" in capsys.readouterr().err


def test_trace_needs_its_file(tmp_path, capsys):
    assert (
        main(["loadtest", "--target", "grpc://127.0.0.1:1", "--workload", "trace", "--out", str(tmp_path)])
        == 2
    )
    assert "--trace: required" in capsys.readouterr().err


@pytest.mark.parametrize(
    "trace, copies, message",
    [
        ("trace.json", "0", "--copies: must be a positive integer, got 0"),
        ("trace.jsonl", "2", "--copies: applies to WEKA traces only"),
    ],
)
def test_copies_of_a_trace_are_checked(tmp_path, capsys, trace, copies, message):
    path = tmp_path / trace
    if trace.endswith(".jsonl"):
        path.write_text(
            json.dumps({"timestamp": 0, "input_length": 64, "output_length": 4, "hash_ids": [1]}) + "\n"
        )
    else:
        path.write_text(
            json.dumps({"id": "t", "requests": [{"t": 0, "type": "n", "in": 64, "out": 4, "hash_ids": [1]}]})
        )
    args = ["loadtest", "--target", "grpc://127.0.0.1:1", "--workload", "trace", "--trace", str(path)]
    assert main(args + ["--copies", copies, "--no-progress", "--out", str(tmp_path / "out")]) == 2
    assert f"baton loadtest: error: {message}" in capsys.readouterr().err
