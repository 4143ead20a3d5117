"""Load-test reports: ``summary.json``, ``requests.csv``, PNG plots and an ``index.html`` per run,
and a comparison page with one throughput/interactivity frontier for several runs.

Files of a run's directory (see ``docs/loadtest.md``)::

    summary.json         pooled metric block, run facts, one block per level
    requests.csv         one row per request record
    latency_cdf.png      TTFT / TPOT / ITL / E2E CDFs, a line per level
    throughput.png       tokens/s and requests/s (with goodput) per level
    frontier.png         output tokens/s per instance against tokens/s per user
    ttft_vs_input.png    TTFT against prompt length
    index.html           all of the above on one page
"""

from collections.abc import Iterable, Mapping
from pathlib import Path

from ..metrics import LatencySamples, Level, Slo, measured, split_levels
from ..records import RequestRecord
from .html import compare_page, report_page
from .plots import (
    FRONTIER_FILE,
    LATENCY_CDF_FILE,
    THROUGHPUT_FILE,
    TTFT_INPUT_FILE,
    frontier_plot,
    latency_cdf_plot,
    pareto_front,
    throughput_plot,
    ttft_vs_input_plot,
)
from .summary import REQUESTS_FILE, SUMMARY_FILE, summarize, write_requests_csv, write_summary

__all__ = [
    "compare_report",
    "frontier_plot",
    "pareto_front",
    "summarize",
    "write_report",
    "INDEX_FILE",
    "REQUESTS_FILE",
    "SUMMARY_FILE",
]

INDEX_FILE = "index.html"


def write_report(
    out_dir: Path | str,
    records: Iterable[RequestRecord],
    duration_s: float,
    slo: Slo,
    config: Mapping,
    server: Mapping,
    instances: int = 1,
    level_durations_s: Mapping[Level, float] | None = None,
) -> dict:
    """Write a run's report files into ``out_dir`` (created if missing) and return the summary.

    Args:
        records: every record of the run, warm-up included (the metrics skip those; the CSV keeps
            them, marked).
        duration_s: the measured window in seconds (all levels together in a sweep).
        slo: goodput targets.
        config: the run's set-up (target, workload meta, driver settings), embedded as given.
        server: server-side counters (e.g. metric deltas over the window), embedded as given.
        instances: what throughput is divided by for the frontier (GPUs or workers).
        level_durations_s: each sweep level's measured window (see ``summarize``).

    Returns:
        The ``summary.json`` content.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = list(records)
    summary = summarize(records, duration_s, slo, config, server, instances, level_durations_s)
    write_summary(out / SUMMARY_FILE, summary)
    write_requests_csv(out / REQUESTS_FILE, records)

    levels = split_levels(records)
    if len(levels) > 1:
        samples = {level.label: LatencySamples.of(members) for level, members in levels.items()}
    else:
        samples = {"all": LatencySamples.of(measured(records))}
    level_blocks = summary["levels"] or [summary]
    latency_cdf_plot(samples, out / LATENCY_CDF_FILE)
    throughput_plot(level_blocks, out / THROUGHPUT_FILE)
    frontier_plot({str(config.get("label", "run")): level_blocks}, out / FRONTIER_FILE)
    ttft_vs_input_plot(records, out / TTFT_INPUT_FILE)
    images = {
        "Latency CDFs": LATENCY_CDF_FILE,
        "Throughput and goodput per level": THROUGHPUT_FILE,
        "Throughput per instance against interactivity": FRONTIER_FILE,
        "TTFT against prompt length": TTFT_INPUT_FILE,
    }
    (out / INDEX_FILE).write_text(report_page(summary, images))
    return summary


def compare_report(
    out_dir: Path | str, summaries: Mapping[str, Mapping], title: str = "Baton load test comparison"
) -> dict[str, Path]:
    """Write ``frontier.png`` (one series per label) and ``index.html`` comparing runs side by side.

    Args:
        summaries: label (e.g. ``colocated``, ``disaggregated``) to that run's ``summary.json``
            content; a run without levels is one point.

    Returns:
        The written files by name.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    series = {label: summary.get("levels") or [summary] for label, summary in summaries.items()}
    frontier = frontier_plot(series, out / FRONTIER_FILE)
    index = out / INDEX_FILE
    index.write_text(
        compare_page(summaries, {"Throughput per instance against interactivity": FRONTIER_FILE}, title)
    )
    return {"frontier": frontier, "index": index}
