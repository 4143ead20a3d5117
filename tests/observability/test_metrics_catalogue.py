"""docs/metrics.md lists exactly what the processes export (names, types, label names), and the
names follow Prometheus conventions."""

import re

import pytest

from tests.observability.exported import ROLES, ROOT, Family, exported

CATALOGUE = ROOT / "docs" / "metrics.md"
UNBOUNDED_LABELS = {"request_id", "prompt", "text", "session", "session_id", "tenant", "user", "token"}


def documented() -> dict[str, tuple[Family, set[str]]]:
    """Metric -> (its family as the table states it, the processes said to update it)."""
    rows = {}
    for line in CATALOGUE.read_text().splitlines():
        if not line.startswith("| `baton_"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 6, f"docs/metrics.md: want 6 cells, got {len(cells)}: {line}"
        name, kind, labels, _unit, updated_by, meaning = cells
        name = name.strip("`")
        assert name not in rows, f"docs/metrics.md: {name} is listed twice"
        assert meaning, f"docs/metrics.md: {name} has no meaning"
        label_names = tuple(re.findall(r"`(\w+)`:", labels)) if labels != "none" else ()
        rows[name] = (Family(name, kind, label_names), {r.strip() for r in updated_by.split(",")})
    assert rows, "docs/metrics.md has no metric table"
    return rows


@pytest.mark.parametrize("role", ROLES)
def test_catalogue_matches_what_each_process_exports(role):
    docs = {name: family for name, (family, _) in documented().items()}
    exports = exported(role)
    assert sorted(set(exports) - set(docs)) == [], "exported but not in docs/metrics.md"
    assert sorted(set(docs) - set(exports)) == [], "in docs/metrics.md but not exported"
    for name, family in exports.items():
        want = docs[name]
        assert (family.type, sorted(family.labels)) == (want.type, sorted(want.labels)), name


def test_every_metric_names_the_processes_that_update_it():
    for name, (_, updated_by) in documented().items():
        assert updated_by and updated_by <= set(ROLES), f"{name}: updated by {updated_by}"


@pytest.mark.parametrize("role", ROLES)
def test_names_and_labels_follow_conventions(role):
    for name, family in exported(role).items():
        assert re.fullmatch(r"baton_[a-z0-9_]+", name), name
        if family.type == "counter":
            assert name.endswith("_total"), name
        else:
            assert not name.endswith("_total"), f"{name}: only counters end in _total"
        stem = name.removesuffix("_total")
        if family.type == "histogram" or re.search(r"(time|latency|duration)", stem):
            assert stem.endswith("_seconds"), f"{name}: durations are in seconds"
        if "bytes" in stem:
            assert stem.endswith("_bytes"), f"{name}: sizes are in bytes"
        assert not re.search(r"_(ms|milliseconds|kb|mb|gb|kib|mib|gib)(_|$)", stem), f"{name}: base units"
        for label in family.labels:
            assert label not in UNBOUNDED_LABELS and not label.endswith("_id"), f"{name}: label {label}"
