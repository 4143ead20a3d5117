"""``summary.json`` (pooled metrics, one block per sweep level, the run's set-up) and ``requests.csv``."""

import csv
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ..metrics import Level, LoadMetrics, Slo, compute_metrics, span_s, split_levels, tpot_s
from ..records import RequestRecord

SUMMARY_FILE = "summary.json"
REQUESTS_FILE = "requests.csv"
REQUEST_COLUMNS = (
    "session_id", "turn", "concurrency", "rate", "warmup", "start_s", "ttft_ms", "tpot_ms", "e2e_ms",
    "input_tokens", "output_tokens", "cached_tokens", "error",
)  # fmt: skip


def jsonable(value):
    """``value`` with non-finite floats as None, tuples as lists and other unknown objects as text."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if hasattr(value, "item"):  # numpy scalars
        return jsonable(value.item())
    return str(value)


def metric_block(metrics: LoadMetrics, instances: int) -> dict:
    """``metrics.to_dict()`` plus output tokens/s per instance (the frontier's y)."""
    block = metrics.to_dict()
    per_instance = metrics.output_tokens_per_s / instances
    block["output_tokens_per_s_per_instance"] = per_instance if math.isfinite(per_instance) else None
    return block


def summarize(
    records: Iterable[RequestRecord],
    duration_s: float,
    slo: Slo,
    config: Mapping,
    server: Mapping,
    instances: int = 1,
    level_durations_s: Mapping[Level, float] | None = None,
) -> dict:
    """The summary: the metric block over every measured request, then run facts and ``levels``.

    Args:
        records: every record of the run (warm-up ones are excluded from the metrics).
        duration_s: the measured window of the whole run (the sum of the levels' windows in a sweep).
        slo: goodput targets; config, server: embedded as given (JSON-safe copies).
        instances: serving instances the throughput is shared by (GPUs, workers: the caller's unit).
        level_durations_s: each level's measured window; a level missing here gets ``duration_s``
            when it is the only level, else its records' span (first start to last end).
    """
    if instances < 1:
        raise ValueError(f"instances: must be at least 1, got {instances}")
    records = list(records)
    levels = split_levels(records)
    durations = dict(level_durations_s or {})
    summary = metric_block(compute_metrics(records, duration_s, slo), instances)
    summary.update(
        instances=instances,
        slo=slo.to_dict(),
        config=jsonable(config),
        server=jsonable(server),
        levels=[],
    )
    for level, members in levels.items():
        window = durations.get(level, duration_s if len(levels) == 1 else span_s(members))
        block = metric_block(compute_metrics(members, window, slo), instances)
        summary["levels"].append(
            {"concurrency": level.concurrency, "rate": level.rate, "label": level.label} | block
        )
    return jsonable(summary)


def write_summary(path: Path, summary: Mapping) -> None:
    """Write ``summary`` as indented JSON; NaN never reaches the file (it is null)."""
    Path(path).write_text(json.dumps(jsonable(summary), indent=2, allow_nan=False) + "\n")


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value * 1e3:.3f}"


def write_requests_csv(path: Path, records: Sequence[RequestRecord]) -> None:
    """One row per record, warm-up included (column ``warmup``); empty cells where nothing was measured.

    Latencies are in milliseconds and blank for failed requests, ``start_s`` is from the run's start.
    """
    with open(path, "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(REQUEST_COLUMNS)
        for record in records:
            writer.writerow(
                [
                    record.session_id,
                    record.turn,
                    "" if record.concurrency is None else record.concurrency,
                    "" if record.rate is None else record.rate,
                    int(record.warmup),
                    f"{record.start_s:.6f}",
                    _ms(record.ttft_s if record.ok else None),
                    _ms(tpot_s(record)),
                    _ms(record.e2e_s if record.ok else None),
                    record.input_tokens,
                    record.output_tokens,
                    record.cached_tokens,
                    record.error or "",
                ]
            )
