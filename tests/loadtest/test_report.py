"""Report files: summary.json keys and values, requests.csv rows, PNGs, index.html, comparisons."""

import csv
import json
import math

import pytest

from loadtest.metrics import Level, Slo
from loadtest.records import RequestRecord
from loadtest.report import compare_report, frontier_plot, pareto_front, plots, summarize, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PNGS = ("latency_cdf.png", "throughput.png", "frontier.png", "ttft_vs_input.png")
METRIC_KEYS = {
    "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "output_tokens_per_s", "total_tokens_per_s", "requests_per_s",
    "goodput_rps", "token_goodput_per_s", "interactivity_tokens_per_s", "error_rate", "valid",
    "cached_token_ratio", "requests", "output_tokens_per_s_per_instance",
}  # fmt: skip


def record(session, concurrency, start, times, end=None, error=None, warmup=False, cached=0):
    return RequestRecord(
        session_id=session, turn=0, start_s=start, input_tokens=200, token_times_s=list(times),
        end_s=(times[-1] if times else start + 1) if end is None else end, output_tokens=len(times),
        cached_tokens=cached, error=error, concurrency=concurrency, warmup=warmup,
    )  # fmt: skip


@pytest.fixture
def sweep():
    """Two levels: concurrency 1 over [0, 4] s, concurrency 4 over [10, 14] s; one warm-up, one failure."""
    return [
        record("w", 1, -5.0, [-4.0, -3.0], warmup=True),
        record("a", 1, 0.0, [1.0, 1.5, 2.0], cached=100),
        record("b", 1, 2.0, [2.5, 3.0, 3.5, 4.0]),
        record("c", 4, 10.0, [11.0, 11.5, 11.5, 12.0]),
        record("d", 4, 10.0, [12.0, 13.0, 14.0], cached=200),
        record("e", 4, 10.0, [], end=10.5, error="INTERNAL: <boom> & co"),
    ]


def read_json(path):
    def refuse(constant):
        raise AssertionError(f"non-JSON constant {constant} in {path}")

    return json.loads(path.read_text(), parse_constant=refuse)


def assert_png(path):
    data = path.read_bytes()
    assert len(data) > 1000 and data.startswith(PNG_MAGIC), path


def test_write_report_files(tmp_path, sweep):
    slo = Slo(ttft_s=1.0, tpot_s=0.6)
    config = {"target": "http://router:8000", "workload": {"name": "<agents>"}, "driver": {"warmup_s": 5}}
    server = {"baton_cached_prompt_tokens_total": 300.0, "baton_transfer_bytes_total": 1e6}
    summary = write_report(
        tmp_path, sweep, duration_s=8.0, slo=slo, config=config, server=server, instances=2
    )

    on_disk = read_json(tmp_path / "summary.json")
    assert on_disk == summary
    assert METRIC_KEYS | {"slo", "config", "server", "levels"} <= set(on_disk)
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert {"p50", "p90", "p99", "p99_9", "mean"} <= set(on_disk[key])
    assert on_disk["requests"] == {"completed": 4, "failed": 1}
    assert on_disk["error_rate"] == pytest.approx(0.2) and on_disk["valid"] is False
    assert on_disk["output_tokens_per_s"] == pytest.approx(14 / 8)
    assert on_disk["output_tokens_per_s_per_instance"] == pytest.approx(14 / 8 / 2)
    assert on_disk["cached_token_ratio"] == pytest.approx(300 / 800)
    assert on_disk["ttft_ms"]["p50"] == pytest.approx(1000.0)  # TTFTs 0.5, 1.0, 1.0, 2.0 s
    assert on_disk["ttft_ms"]["p90"] == pytest.approx(1700.0)  # rank 2.7: 1.0 + 0.7 * (2.0 - 1.0)
    assert on_disk["slo"] == {"ttft_ms": 1000.0, "tpot_ms": 600.0}
    assert on_disk["config"] == config and on_disk["server"] == server

    levels = on_disk["levels"]
    assert [(level["concurrency"], level["rate"]) for level in levels] == [(1, None), (4, None)]
    assert all(METRIC_KEYS <= set(level) for level in levels)
    assert levels[0]["duration_s"] == pytest.approx(4.0)  # its records' span (no durations given)
    assert levels[0]["requests"] == {"completed": 2, "failed": 0} and levels[0]["valid"] is True
    assert levels[1]["requests"] == {"completed": 2, "failed": 1}
    assert levels[1]["output_tokens_per_s"] == pytest.approx(7 / 4)
    # Level 1 goodput: "a" (TTFT 1.0, TPOT 0.5) and "b" (0.5, 0.5) are good over 4 s.
    assert levels[0]["goodput_rps"] == pytest.approx(2 / 4)
    # Level 4: "c" TTFT 1.0, TPOT 1/3 is good; "d" TTFT 2.0 misses.
    assert levels[1]["goodput_rps"] == pytest.approx(1 / 4) and levels[1]["token_goodput_per_s"] == 1.0

    with open(tmp_path / "requests.csv", newline="") as rows_file:
        rows = list(csv.DictReader(rows_file))
    assert [row["session_id"] for row in rows] == [r.session_id for r in sweep]
    assert rows[0]["warmup"] == "1" and rows[1]["ttft_ms"] == "1000.000" and rows[1]["tpot_ms"] == "500.000"
    assert rows[5]["ttft_ms"] == "" and rows[5]["error"] == "INTERNAL: <boom> & co"
    assert {
        "turn",
        "concurrency",
        "start_s",
        "e2e_ms",
        "input_tokens",
        "output_tokens",
        "cached_tokens",
    } <= set(rows[0])

    for name in PNGS:
        assert_png(tmp_path / name)
    page = (tmp_path / "index.html").read_text()
    for name in PNGS:
        assert f'src="{name}"' in page
    assert "&lt;agents&gt;" in page and "<agents>" not in page


def test_given_level_durations_are_used(sweep):
    durations = {Level(1, None): 5.0, Level(4, None): 7.0}
    summary = summarize(sweep, 12.0, Slo(), {}, {}, level_durations_s=durations)
    assert [level["duration_s"] for level in summary["levels"]] == [5.0, 7.0]
    assert summary["levels"][0]["requests_per_s"] == pytest.approx(2 / 5)


def test_single_level_uses_the_run_window():
    records = [record("a", None, 0.0, [1.0, 2.0]), record("b", None, 1.0, [2.0, 3.0])]
    summary = summarize(records, 10.0, Slo(), {}, {})
    assert len(summary["levels"]) == 1 and summary["levels"][0]["duration_s"] == 10.0
    assert summary["levels"][0]["label"] == "all"


def test_no_completed_requests(tmp_path, monkeypatch):
    said = []
    real = plots._no_data
    monkeypatch.setattr(plots, "_no_data", lambda axes: (said.append(axes), real(axes)))
    records = [record("x", 2, 0.0, [], error="UNAVAILABLE: down")]
    summary = write_report(tmp_path, records, 3.0, Slo(1.0, 0.1), {}, {})
    on_disk = read_json(tmp_path / "summary.json")
    assert on_disk["ttft_ms"]["p50"] is None and on_disk["cached_token_ratio"] is None
    assert on_disk["levels"][0]["itl_ms"]["mean"] is None and summary["valid"] is False
    # Every CDF panel, the frontier (no interactivity) and the scatter; throughput is a real 0/s.
    assert len(said) == 4 + 1 + 1
    for name in PNGS:
        assert_png(tmp_path / name)

    empty = write_report(tmp_path / "empty", [], 0.0, Slo(), {}, {})
    assert empty["levels"] == [] and empty["error_rate"] is None and empty["requests_per_s"] is None
    assert (tmp_path / "empty" / "index.html").exists()


def test_compare_report(tmp_path, sweep):
    colocated = summarize(sweep, 8.0, Slo(), {}, {})
    disaggregated = json.loads(json.dumps(colocated))
    for level in disaggregated["levels"]:
        level["output_tokens_per_s_per_instance"] *= 1.5
    written = compare_report(tmp_path / "cmp", {"colocated": colocated, "<disagg>": disaggregated})
    assert_png(written["frontier"])
    page = written["index"].read_text()
    assert 'src="frontier.png"' in page and "&lt;disagg&gt;" in page and "<disagg>" not in page


def test_pareto_front():
    points = [(1.0, 10.0), (2.0, 8.0), (1.5, 7.0), (3.0, 8.0), (4.0, 2.0), (4.0, 1.0), (1.0, 10.0)]
    # (2, 8) is beaten by (3, 8); (1.5, 7) by (2, 8); (4, 1) by (4, 2).
    assert pareto_front(points) == [(1.0, 10.0), (3.0, 8.0), (4.0, 2.0)]
    assert pareto_front([]) == []


def test_frontier_plot_several_series(tmp_path):
    def level(x, y, concurrency):
        return {
            "interactivity_tokens_per_s": {"p50": x},
            "output_tokens_per_s_per_instance": y,
            "concurrency": concurrency,
        }

    series = {
        "colocated": [level(50.0, 900.0, 64), level(80.0, 600.0, 16), level(60.0, 500.0, 32)],
        "disaggregated": [level(55.0, 1200.0, 64), level(90.0, 700.0, 16), level(math.nan, None, 1)],
    }
    assert_png(frontier_plot(series, tmp_path / "frontier.png"))
    assert_png(frontier_plot({}, tmp_path / "empty.png"))
