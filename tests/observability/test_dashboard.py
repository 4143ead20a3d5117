"""deploy/grafana/baton.json: a dashboard Grafana can import anywhere (datasource and job variables),
whose every query reads a series a Baton process exports or a recording rule defines."""

import json

import pytest

from tests.observability.exported import BUILTIN, ROOT, metric_names, recording_rules, series_names

DASHBOARD = ROOT / "deploy" / "grafana" / "baton.json"


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict) -> list[dict]:
    """Every panel, rows' nested panels included."""
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", ()))
    return found


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and query variable."""
    found = [
        (f"panel {panel['title']!r}", target["expr"])
        for panel in panels(dashboard)
        for target in panel.get("targets", ())
    ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            query = query["query"] if isinstance(query, dict) else query
            found.append((f"variable {variable['name']!r}", query.removeprefix("label_values(")))
    return found


def test_every_query_reads_an_exported_metric_or_a_recording_rule(dashboard):
    known = series_names() | set(recording_rules()) | BUILTIN
    for where, expr in queries(dashboard):
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        assert names - known == set(), f"{where}: unknown series in {expr!r}"


def test_shape_variables_and_datasource(dashboard):
    assert dashboard["schemaVersion"] >= 39 and dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    assert {"job", "instance"} <= set(variables)
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in panels(dashboard):
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]), panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}" and target["expr"], panel["title"]
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"]["uid"] == "${datasource}", variable["name"]


def test_latency_panels_draw_the_slo_targets(dashboard):
    exprs = {panel["title"]: {t["expr"] for t in panel.get("targets", ())} for panel in panels(dashboard)}
    assert "baton:slo_ttft_seconds:target" in exprs["Time to first token"]
    assert "baton:slo_tpot_seconds:target" in exprs["Time per output token"]
    assert "baton:slo_tpot_seconds:target" in exprs["Inter-token latency"]
    read = set().union(*(metric_names(expr) for _, expr in queries(dashboard)))
    for wanted in (
        "job:baton_goodput:ratio_rate5m",
        "baton_router_queued_requests",
        "instance:baton_kv_blocks_used:ratio",
        "instance:baton_kda_slots_used:ratio",
        "job:baton_prefix_cache_hit:ratio_rate5m",
        "job_backend:baton_transfer_bandwidth_bytes_per_second:ratio_rate5m",
        "job_backend:baton_transfer_failures:rate5m",
        "job_target:baton_handoff_fallbacks:rate5m",
        "job_reason:baton_local_prefills:rate5m",
        "baton_worker_up",
    ):
        assert wanted in read, f"no panel shows {wanted}"


def test_the_hicache_row_shows_hits_traffic_pages_failures_and_health(dashboard):
    rows = [panel for panel in dashboard["panels"] if panel["type"] == "row"]
    assert "HiCache" in [row["title"] for row in rows]
    start = dashboard["panels"].index(next(row for row in rows if row["title"] == "HiCache"))
    end = next((i for i, p in enumerate(dashboard["panels"]) if i > start and p["type"] == "row"), None)
    row_panels = dashboard["panels"][start + 1 : end]
    read = set().union(*(metric_names(t["expr"]) for panel in row_panels for t in panel["targets"]))
    for wanted in (
        "job_tier_kind:baton_prefix_cache_hit_tokens:rate5m",  # hits by tier and kind
        "job_kind:baton_hicache_hit:ratio_rate5m",  # the tier's hit ratio
        "job_kind_direction:baton_hicache_moved_bytes:rate5m",  # bytes/s each way
        "baton_hicache_pages_used",
        "baton_hicache_pages_capacity",
        "baton_hicache_evictions_total",
        "baton_prefix_cache_evictions_total",
        "baton_hicache_offloads_total",
        "baton_hicache_checksum_failures_total",
        "baton_hicache_load_fallbacks_total",
        "baton_hicache_prefetch_wait_seconds_bucket",
        "baton_hicache_tier_up",
        "baton_hicache_redis_up",
    ):
        assert wanted in read, f"the HiCache row shows no {wanted}"
    hits = next(panel for panel in row_panels if panel["title"] == "Prefix hit tokens by tier")
    assert "by (tier, kind)" in hits["targets"][0]["expr"], "hits must be split by tier and by kind"
    traffic = next(panel for panel in row_panels if panel["title"] == "Worker <-> tier bytes/s")
    assert "direction" in traffic["targets"][0]["expr"]
    assert traffic["fieldConfig"]["defaults"]["unit"] == "Bps"


def test_the_speculative_decoding_row_shows_acceptance_length_and_draft_time(dashboard):
    start = next(i for i, p in enumerate(dashboard["panels"]) if p["title"] == "Speculative decoding")
    end = next((i for i, p in enumerate(dashboard["panels"]) if i > start and p["type"] == "row"), None)
    row_panels = {panel["title"]: panel for panel in dashboard["panels"][start + 1 : end]}
    exprs = {title: " ".join(t["expr"] for t in panel["targets"]) for title, panel in row_panels.items()}
    by_position = exprs["Acceptance rate by draft position"]
    assert "by (position)" in by_position
    assert {"baton_spec_accepted_tokens_total", "baton_spec_drafted_tokens_total"} <= metric_names(
        by_position
    )
    length = metric_names(exprs["Mean accepted length"])
    assert {"baton_spec_accepted_tokens_total", "baton_spec_accepted_length_total"} <= length
    time_share = metric_names(exprs["Draft time share"])
    assert time_share == {"baton_spec_draft_seconds_total", "baton_spec_target_seconds_total"}
    draft_tokens = exprs["Draft tokens per step"]
    assert "by (draft_tokens)" in draft_tokens
    assert metric_names(draft_tokens) == {"baton_spec_steps_total", "baton_spec_draft_tokens"}
