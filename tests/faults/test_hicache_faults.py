"""HiCache's faults on a real cluster (issue 16), started as ``baton serve --host-cache-gib`` starts it: a
prefill and a decode worker, the node's ``baton cache`` tier, a redis-server. Multi-turn sessions with a
shared system prefix run throughout (a device pool too small for all of them, so later turns load from
the tier) while the tier is SIGKILLed, then Redis. No turn may fail; the supervisor restarts the tier,
the workers attach to its new run and load from it again; Redis down reads 0 on the router's and the
tier's ``baton_hicache_redis_up`` with a log line each, back reads 1 and the tier's index is written
back; the workers hold nothing at the end. One cluster, one run (about 40 s on 2 cores)."""

import pytest

from deploy.benchmark.faults.sessions import SessionPlan
from deploy.benchmark.faults.tier_faults import TierFaultScenario, run_tier_faults, tier_fault_cluster
from deploy.benchmark.worker_threads import worker_threads

SCENARIO = TierFaultScenario(sessions=SessionPlan(sessions=4), warm_turns=8)


@pytest.fixture(scope="module")
def report(tiny_checkpoint):
    model = str(tiny_checkpoint("k3"))
    with worker_threads(1):
        try:
            cluster = tier_fault_cluster(model, SCENARIO)
        except FileNotFoundError as error:  # no redis-server: `make test` installs it
            pytest.skip(f"{error}")
        try:
            yield run_tier_faults(cluster, model, SCENARIO)
        finally:
            cluster.stop()


def test_no_turn_fails_through_either_fault(report):
    assert report.failed() == [], report.format_table()
    assert report.tier_outage_turns() and report.redis_outage_turns()  # turns ran through both outages
    before_kill = [o for o in report.outcomes if o.ended < report.tier_kill.killed_at]
    assert any(o.cached_tokens_host > 0 for o in before_kill)  # the tier served hits before its kill too


def test_the_tier_is_restarted_and_the_workers_load_from_its_new_run(report):
    kill = report.tier_kill
    assert kill.restarts == 1 and kill.restarted_s is not None, report.format_table()
    assert kill.tier_hit_s is not None and kill.tier_hit_s > kill.restarted_s
    # Each worker attached to the new run by itself; one that called the tier during the outage logged
    # it once (a worker may have had no call to make meanwhile).
    assert kill.workers_reattached == ("prefill-0", "decode-0"), report.worker_lines
    outages = {
        worker: sum(line.startswith(f"[{worker}]") and "unreachable" in line for line in report.worker_lines)
        for worker in kill.workers_reattached
    }
    assert set(outages.values()) <= {0, 1} and sum(outages.values()) >= 1, report.worker_lines


def test_redis_down_is_a_metric_and_a_log_line_and_back_it_is_used_again(report):
    outage = report.redis_outage
    assert outage.reported_down_s is not None and outage.reported_up_s is not None, report.format_table()
    assert outage.index_republished  # the restarted Redis is empty: the tier wrote its sets again
    assert any("unavailable" in line for line in report.router_lines), report.router_lines
    assert any("redis" in line and "unavailable" in line for line in report.tier_lines), report.tier_lines


def test_every_worker_holds_nothing_at_the_end(report):
    assert len(report.leaks.workers) == 2
    assert report.leaks.clean, [w for w in report.leaks.workers if not w.clean]


@pytest.mark.parametrize(
    "make, error",
    [
        (lambda: SessionPlan(sessions=0), "sessions: must be >= 1"),
        (lambda: SessionPlan(max_prompt_tokens=20), "max_prompt_tokens: 20 cannot hold a first turn"),
        (
            lambda: TierFaultScenario(kv_blocks=8),
            r"kv_blocks: 8 blocks of 8 tokens cannot hold 2 \(max_num_seqs\)",
        ),
        (lambda: TierFaultScenario(warm_turns=0), "warm_turns: must be > 0"),
    ],
    ids=["no-sessions", "short-prompt", "small-pool", "no-warm-up"],
)
def test_a_scenario_out_of_range_is_refused_naming_the_field(make, error):
    with pytest.raises(ValueError, match=error):
        make()
