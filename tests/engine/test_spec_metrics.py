"""Speculative decoding's metrics: an engine pass carries the engine's ``SpecCounts`` (None when it drafts
nothing), and the worker's ``Metrics.observe_spec`` turns successive totals into counter growth."""

import pytest
from prometheus_client import generate_latest

from common.metrics import Metrics
from services.engine.engine_config import EngineConfig
from services.engine.engine_core import EngineCore
from services.engine.engine_service import EngineService
from services.engine.speculative.spec_counters import SpecCounters, SpecCounts
from tests.conftest import TEST_DEVICE


def sample_values(metrics: Metrics) -> dict[str, float]:
    """``'name{labels}' -> value`` of every ``baton_spec_*`` sample (no ``_created``)."""
    values = {}
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith("baton_spec_") and "_created" not in line:
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_two_successive_counts_grow_the_counters_by_their_difference():
    counters = SpecCounters(3)
    metrics = Metrics("decode")
    metrics.observe_spec(None)  # an engine that drafts nothing: no labelled series
    assert sample_values(metrics) == {
        "baton_spec_draft_seconds_total": 0.0,
        "baton_spec_target_seconds_total": 0.0,
        "baton_spec_draft_tokens": 0.0,
    }

    counters.stepped(3)
    counters.verified(3, 1)
    counters.verified(3, 3)
    counters.add_draft_seconds(0.25)
    counters.add_target_seconds(1.0)
    metrics.observe_spec(counters.counts())
    counters.stepped(0)  # a plain step the policy chose
    counters.stepped(2)
    counters.verified(2, 0)  # near max_tokens: two drafts
    counters.verified(3, 2)
    counters.add_draft_seconds(0.5)
    counters.add_target_seconds(2.0)
    metrics.observe_spec(counters.counts())
    metrics.observe_spec(counters.counts())  # the same totals again: no growth

    assert sample_values(metrics) == {
        'baton_spec_accepted_length_total{length="0"}': 1.0,
        'baton_spec_accepted_length_total{length="1"}': 1.0,
        'baton_spec_accepted_length_total{length="2"}': 1.0,
        'baton_spec_accepted_length_total{length="3"}': 1.0,
        'baton_spec_drafted_tokens_total{position="0"}': 4.0,
        'baton_spec_drafted_tokens_total{position="1"}': 4.0,
        'baton_spec_drafted_tokens_total{position="2"}': 3.0,
        'baton_spec_accepted_tokens_total{position="0"}': 3.0,
        'baton_spec_accepted_tokens_total{position="1"}': 2.0,
        'baton_spec_accepted_tokens_total{position="2"}': 1.0,
        "baton_spec_draft_seconds_total": 0.75,
        "baton_spec_target_seconds_total": 3.0,
        'baton_spec_steps_total{draft_tokens="0"}': 1.0,
        'baton_spec_steps_total{draft_tokens="1"}': 0.0,
        'baton_spec_steps_total{draft_tokens="2"}': 1.0,
        'baton_spec_steps_total{draft_tokens="3"}': 1.0,
        "baton_spec_draft_tokens": 2.0,
    }


def test_a_worker_exporter_started_late_counts_the_totals_once():
    """A ``Metrics`` that first sees the engine after some verifies starts from the totals, then grows."""
    metrics = Metrics("decode")
    first = SpecCounts(1, 5, (2, 3), (5,), (3,), 0.5, 4.0)
    later = SpecCounts(1, 7, (2, 5), (7,), (5,), 0.75, 5.0)
    metrics.observe_spec(first)
    assert sample_values(metrics)['baton_spec_accepted_tokens_total{position="0"}'] == 3.0
    metrics.observe_spec(later)
    values = sample_values(metrics)
    assert values['baton_spec_accepted_length_total{length="1"}'] == 5.0
    assert values['baton_spec_drafted_tokens_total{position="0"}'] == 7.0
    assert values["baton_spec_draft_seconds_total"] == 0.75


@pytest.fixture(scope="module")
def service(tiny_checkpoint):
    config = EngineConfig(model=str(tiny_checkpoint("k3")), device=TEST_DEVICE, dtype="float32")
    core = EngineCore(config)
    engine = EngineService(core)
    passes = []
    engine.observe(passes.append)
    yield core, engine, passes
    engine.close()


def test_an_engine_pass_carries_the_engine_spec_counts(service):
    core, engine, passes = service
    core.spec_counters = None  # an engine core that drafts nothing
    engine.refresh()
    assert passes[-1].spec_counts is None
    counters = SpecCounters(2)
    counters.verified(2, 1)
    counters.add_draft_seconds(0.125)
    core.spec_counters = counters
    engine.refresh()
    assert passes[-1].spec_counts == SpecCounts(2, 1, (0, 1, 0), (1, 1), (1, 0), 0.125, 0.0, 2, (0, 0, 0))
