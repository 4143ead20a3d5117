"""The report's PNG plots (matplotlib, Agg canvas, no pyplot state).

Every plot function takes plain data and a path, writes one PNG, and says "no data" in an axis
that has nothing finite to draw instead of failing.
"""

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..metrics import LatencySamples
from ..records import RequestRecord

if TYPE_CHECKING:
    from matplotlib.figure import Figure

LATENCY_CDF_FILE = "latency_cdf.png"
THROUGHPUT_FILE = "throughput.png"
FRONTIER_FILE = "frontier.png"
TTFT_INPUT_FILE = "ttft_vs_input.png"


def _figure(width: float, height: float) -> "Figure":
    # Imported here, not at the top: matplotlib costs most of a second, and every ``baton`` process
    # (each worker, each rank) imports this module through the CLI, while only a report draws.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure: "Figure", out: Path) -> Path:
    figure.savefig(out, format="png")
    return Path(out)


def _no_data(axes) -> None:
    axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes, color="gray")


def _finite(value) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def latency_cdf_plot(samples_by_label: Mapping[str, LatencySamples], out: Path) -> Path:
    """Empirical CDFs of TTFT, TPOT, ITL and E2E (ms), one line per label (a level, or ``all``)."""
    figure = _figure(10, 7)
    panels = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E"))
    for axes, (name, title) in zip(figure.subplots(2, 2).flat, panels, strict=True):
        drawn = False
        for label, samples in samples_by_label.items():
            values = getattr(samples, name)
            values = values[np.isfinite(values)] * 1e3
            if values.size == 0:
                continue
            axes.ecdf(values, label=label)
            drawn = True
        axes.set(title=f"{title} CDF", xlabel=f"{title} (ms)", ylabel="fraction of samples", ylim=(0, 1.02))
        axes.grid(alpha=0.3)
        if drawn:
            if len(samples_by_label) > 1:
                axes.legend(fontsize="small")
        else:
            _no_data(axes)
    return _save(figure, out)


def _level_name(level: Mapping) -> str:
    if level.get("concurrency") is not None:
        return str(level["concurrency"])
    if level.get("rate") is not None:
        return f"{level['rate']:g}/s"
    return "all"


def throughput_plot(levels: Sequence[Mapping], out: Path) -> Path:
    """Per level: output tokens/s and token goodput (left), requests/s and goodput (right)."""
    figure = _figure(10, 4)
    tokens_axes, requests_axes = figure.subplots(1, 2)
    names = [_level_name(level) for level in levels]
    panels = (
        (tokens_axes, "tokens/s", (("output_tokens_per_s", "output"), ("token_goodput_per_s", "goodput"))),
        (requests_axes, "requests/s", (("requests_per_s", "completed"), ("goodput_rps", "goodput"))),
    )
    for axes, unit, series in panels:
        drawn = False
        for key, label in series:
            points = [(i, _finite(level.get(key))) for i, level in enumerate(levels)]
            points = [(i, y) for i, y in points if y is not None]
            if points:
                axes.plot(*zip(*points, strict=True), marker="o", label=label)
                drawn = True
        axes.set_xticks(range(len(names)), names)
        axes.set(title=f"{unit} per level", xlabel="concurrency (or rate)", ylabel=unit)
        axes.grid(alpha=0.3)
        if drawn:
            axes.set_ylim(bottom=0)
            axes.legend(fontsize="small")
        else:
            _no_data(axes)
    return _save(figure, out)


def frontier_point(level: Mapping) -> tuple[float, float] | None:
    """(median tokens/s per user, output tokens/s per instance) of a metric block; None if not finite."""
    x = _finite((level.get("interactivity_tokens_per_s") or {}).get("p50"))
    y = _finite(level.get("output_tokens_per_s_per_instance"))
    return None if x is None or y is None else (x, y)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both axes (higher is better on each), by increasing x.

    A point is dominated when another is at least as good on both axes and better on one;
    duplicates are kept once.
    """
    front: list[tuple[float, float]] = []
    for x, y in sorted(set(points), key=lambda point: (-point[0], -point[1])):
        if not front or y > front[-1][1]:  # every kept point has x >= this one's
            front.append((x, y))
    return front[::-1]


def frontier_plot(series: Mapping[str, Sequence[Mapping]], out: Path) -> Path:
    """Throughput per instance against interactivity, one marker per level, Pareto points joined.

    Args:
        series: label (e.g. ``colocated``, ``disaggregated``) to metric blocks, typically a
            summary's ``levels``; each block needs ``interactivity_tokens_per_s.p50`` (x, tokens/s
            per user) and ``output_tokens_per_s_per_instance`` (y).
        out: the PNG to write.
    """
    figure = _figure(7, 5)
    axes = figure.subplots()
    top_x = top_y = 0.0
    for index, (label, levels) in enumerate(series.items()):
        color = f"C{index}"
        located = [(point, level) for level in levels if (point := frontier_point(level)) is not None]
        if not located:
            continue
        xs, ys = zip(*(point for point, _ in located), strict=True)
        top_x, top_y = max(top_x, *xs), max(top_y, *ys)
        axes.scatter(xs, ys, color=color, alpha=0.5)
        front = pareto_front([point for point, _ in located])
        axes.plot(*zip(*front, strict=True), color=color, marker="o", label=label)
        for (x, y), level in located:
            axes.annotate(_level_name(level), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    axes.set(
        title="throughput against interactivity",
        xlabel="interactivity: median tokens/s per user (1 / TPOT)",
        ylabel="output tokens/s per instance",
    )
    axes.grid(alpha=0.3)
    if top_x > 0 or top_y > 0:
        axes.set_xlim(0, top_x * 1.15 or 1.0)
        axes.set_ylim(0, top_y * 1.15 or 1.0)
        axes.legend(fontsize="small")
    else:
        _no_data(axes)
    return _save(figure, out)


def ttft_vs_input_plot(records: Sequence[RequestRecord], out: Path) -> Path:
    """TTFT (ms) against prompt tokens for completed measured requests, cache hits coloured."""
    figure = _figure(7, 5)
    axes = figure.subplots()
    done = [r for r in records if r.ok and not r.warmup and r.ttft_s is not None]
    points = [(r.input_tokens, r.ttft_s * 1e3, r.cached_tokens / max(r.input_tokens, 1)) for r in done]
    axes.set(title="TTFT against prompt length", xlabel="input tokens", ylabel="TTFT (ms)")
    axes.grid(alpha=0.3)
    if points:
        xs, ys, cached = zip(*points, strict=True)
        dots = axes.scatter(xs, ys, c=cached, cmap="viridis", vmin=0, vmax=1, s=10, alpha=0.7)
        figure.colorbar(dots, ax=axes, label="cached fraction of the prompt")
    else:
        _no_data(axes)
    return _save(figure, out)
