"""Self-contained HTML pages: one run's ``index.html`` and the side-by-side comparison page.

Inline CSS, images by relative path, and every piece of text escaped (labels, config values and
error strings come from users and servers).
"""

import json
from collections.abc import Mapping, Sequence
from html import escape

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1200px; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
thead th { background: #f0f0f0; }
pre { background: #f7f7f7; padding: 1em; overflow-x: auto; }
img { max-width: 100%; margin: 1em 0; display: block; }
.valid { color: #1a7f37; } .invalid { color: #cf222e; }
"""

DISTRIBUTIONS = (
    ("ttft_ms", "TTFT (ms)"),
    ("tpot_ms", "TPOT (ms)"),
    ("itl_ms", "ITL (ms)"),
    ("e2e_ms", "E2E (ms)"),
    ("interactivity_tokens_per_s", "interactivity (tokens/s per user)"),
)
STATS = ("p50", "p90", "p99", "p99_9", "mean")
SCALARS = (
    ("output_tokens_per_s", "output tokens/s"),
    ("output_tokens_per_s_per_instance", "output tokens/s per instance"),
    ("total_tokens_per_s", "total tokens/s"),
    ("requests_per_s", "requests/s"),
    ("goodput_rps", "goodput (requests/s)"),
    ("token_goodput_per_s", "token goodput (tokens/s)"),
    ("cached_token_ratio", "cached token ratio"),
    ("error_rate", "error rate"),
)


def _number(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return str(value)


def _cell(value, tag: str = "td") -> str:
    return f"<{tag}>{escape(_number(value) if not isinstance(value, str) else value)}</{tag}>"


def _table(header: Sequence, rows: Sequence[Sequence]) -> str:
    head = "".join(_cell(str(item), "th") for item in header)
    body = "".join("<tr>" + "".join(_cell(item) for item in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _page(title: str, body: str) -> str:
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{STYLE}</style></head>\n<body><h1>{escape(title)}</h1>\n{body}\n</body></html>\n"
    )


def _image(src: str, alt: str) -> str:
    return f'<img src="{escape(src)}" alt="{escape(alt)}">'


def _json(value) -> str:
    return f"<pre>{escape(json.dumps(value, indent=2, sort_keys=True))}</pre>"


def distribution_table(block: Mapping) -> str:
    rows = [[name] + [(block.get(key) or {}).get(stat) for stat in STATS] for key, name in DISTRIBUTIONS]
    return _table(["metric", *STATS], rows)


def scalar_rows(block: Mapping) -> list[list]:
    return [[name, block.get(key)] for key, name in SCALARS]


def levels_table(levels: Sequence[Mapping]) -> str:
    header = ["level", "completed", "failed", "TTFT p50 ms", "TPOT p50 ms", "ITL p99 ms", "tokens/s/user p50"]
    header += [name for _, name in SCALARS] + ["valid"]
    rows = []
    for level in levels:
        requests = level.get("requests") or {}
        row = [level.get("label", ""), requests.get("completed"), requests.get("failed")]
        row += [(level.get("ttft_ms") or {}).get("p50"), (level.get("tpot_ms") or {}).get("p50")]
        row += [
            (level.get("itl_ms") or {}).get("p99"),
            (level.get("interactivity_tokens_per_s") or {}).get("p50"),
        ]
        row += [level.get(key) for key, _ in SCALARS] + [level.get("valid")]
        rows.append(row)
    return _table(header, rows)


def report_page(summary: Mapping, images: Mapping[str, str], title: str = "Baton load test") -> str:
    """One run's page: validity, the summary tables, per-level table, plots, config and server counters.

    Args:
        summary: the ``summary.json`` content.
        images: caption to PNG path relative to the page.
    """
    valid = bool(summary.get("valid"))
    requests = summary.get("requests") or {}
    verdict = "valid" if valid else "not valid (error rate above 10%, or no requests)"
    facts = (
        f"{_number(requests.get('completed'))} completed, {_number(requests.get('failed'))} failed, "
        f"{_number(summary.get('duration_s'))} s measured, {_number(summary.get('instances'))} instance(s)."
    )
    parts = [
        f'<p class="{"valid" if valid else "invalid"}"><b>{escape(verdict)}</b>: {escape(facts)}</p>',
        "<h2>Latency</h2>",
        distribution_table(summary),
        "<h2>Throughput</h2>",
        _table(["metric", "value"], scalar_rows(summary)),
        "<h2>SLO</h2>",
        _table(["target", "value"], [[key, value] for key, value in (summary.get("slo") or {}).items()]),
    ]
    if summary.get("levels"):
        parts += ["<h2>Levels</h2>", levels_table(summary["levels"])]
    parts.append("<h2>Plots</h2>")
    parts += [f"<h3>{escape(caption)}</h3>{_image(src, caption)}" for caption, src in images.items()]
    parts += ["<h2>Configuration</h2>", _json(summary.get("config") or {})]
    parts += ["<h2>Server counters</h2>", _json(summary.get("server") or {})]
    return _page(title, "\n".join(parts))


def compare_page(summaries: Mapping[str, Mapping], images: Mapping[str, str], title: str) -> str:
    """Runs side by side: one column per label, rows of pooled metrics, then each run's levels."""
    labels = list(summaries)
    rows = [["valid", *(summaries[label].get("valid") for label in labels)]]
    for key, name in DISTRIBUTIONS:
        for stat in ("p50", "p99"):
            rows.append(
                [f"{name} {stat}", *((summaries[label].get(key) or {}).get(stat) for label in labels)]
            )
    for key, name in SCALARS:
        rows.append([name, *(summaries[label].get(key) for label in labels)])
    parts = [_table(["metric", *labels], rows), "<h2>Plots</h2>"]
    parts += [f"<h3>{escape(caption)}</h3>{_image(src, caption)}" for caption, src in images.items()]
    for label in labels:
        if summaries[label].get("levels"):
            parts += [f"<h2>Levels: {escape(label)}</h2>", levels_table(summaries[label]["levels"])]
    return _page(title, "\n".join(parts))
