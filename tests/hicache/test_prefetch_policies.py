"""The prefetch policies' admission, on a real scheduler, cache manager and host tier with a stand-in L3
whose prefetches finish when the test says (tickets) and a clock the test steps: ``wait`` holds the
request until its prefetch is over, ``timeout_ms`` until then or N ms after arrival, ``best_effort`` not
at all; the flags are checked naming the flag."""

import math
import threading

import pytest
import torch

from common.metrics import Metrics
from common.sampling_params import SamplingParams
from services.engine.cache.block_pool import BlockPool
from services.engine.cache.layout import block_layout, slot_layout
from services.engine.cache.snapshot_store import SnapshotStore
from services.engine.cache.state_pool import StateSlotPool
from services.engine.cache_manager import CacheManager
from services.engine.checkpoint.presets import preset_config
from services.engine.engine_config import EngineConfig
from services.engine.engine_core import EngineCore
from services.engine.engine_loop import EngineLoop
from services.engine.host_cache_connector import HostCacheConnector
from services.engine.model.config_loader import load_model_config
from services.engine.prefetch_gate import PrefetchGate
from services.engine.request import Request
from services.engine.scheduler import SampledToken, Scheduler
from services.hicache.tier_l3 import PrefetchTicket

BLOCK = 4


class StandInL3:
    """A ``PrefetchPort`` that records each prefetch's chain and hands out tickets the test finishes."""

    def __init__(self):
        self.started: list[tuple[list[bytes], PrefetchTicket]] = []

    def prefetch(self, hashes, has_state, tenant=""):
        handle = PrefetchTicket()
        self.started.append((list(hashes), handle))
        return handle


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(policy: str, timeout_ms: int = 500):
    config = load_model_config(preset_config("k3", "tiny"))
    blocks = BlockPool(block_layout(config, BLOCK, torch.float32), BLOCK, 16, "cpu")
    slots = StateSlotPool(slot_layout(config, torch.float32), 2, "cpu")
    host = HostCacheConnector.in_process(blocks, slots, gib=0.001, kda_fraction=0.5)
    host.prefetcher = l3 = StandInL3()
    clock = Clock()
    gate = PrefetchGate(policy, timeout_ms, clock=clock)
    cache = CacheManager(blocks, slots, SnapshotStore(slots.layout, 2, "cpu"), host=host, prefetch_gate=gate)
    return Scheduler(cache, 2, 64, 64), l3, clock


def arrive(scheduler, name: str, length: int = 10) -> Request:
    first = 100 * sum(map(ord, name))  # prompts apart: no request hits another's blocks
    request = Request(name, list(range(first, first + length)), SamplingParams(max_tokens=2), frozenset())
    scheduler.add(request)
    return request


def admitted(scheduler) -> list[str]:
    """The requests one step admits (their first chunk; running ones decode beside them)."""
    output = scheduler.schedule()
    scheduler.update(output, {c.request_id: SampledToken(1, None, None) for c in output.chunks if c.samples})
    return [chunk.request_id for chunk in output.chunks if chunk.past == 0]


def test_wait_holds_the_request_until_its_prefetch_is_over():
    scheduler, l3, clock = make("wait")
    request = arrive(scheduler, "a")
    ((hashes, prefetch),) = l3.started
    assert hashes == request.block_hashes[:2]  # the prompt's full blocks before its last token
    clock.now += 3600
    assert admitted(scheduler) == [] and admitted(scheduler) == []  # however long it takes
    prefetch.finish()
    assert admitted(scheduler) == ["a"]
    outcomes = scheduler.cache.take_prefetch_outcomes()
    assert [(o.policy, o.outcome, o.wait_s) for o in outcomes] == [
        ("wait", "started", None),
        ("wait", "completed", 3600),
    ]
    assert scheduler.cache.prefetch_gate.pending == 0
    metrics = Metrics("decode")  # as the worker observes each pass's outcomes
    metrics.observe_prefetches(outcomes)
    sample = metrics.registry.get_sample_value
    assert sample("baton_hicache_prefetches_total", {"outcome": "started"}) == 1
    assert sample("baton_hicache_prefetches_total", {"outcome": "completed"}) == 1
    assert sample("baton_hicache_prefetch_wait_seconds_sum", {"policy": "wait"}) == 3600


def test_timeout_ms_releases_the_request_after_n_ms_from_arrival():
    scheduler, l3, clock = make("timeout_ms", timeout_ms=250)
    arrive(scheduler, "a")
    clock.now += 0.249
    assert admitted(scheduler) == []
    clock.now += 0.001
    assert admitted(scheduler) == ["a"]  # the prefetch is not done: it waited its 250 ms
    (_, outcome) = scheduler.cache.take_prefetch_outcomes()
    assert (outcome.outcome, round(outcome.wait_s, 6)) == ("timed_out", 0.25)


def test_timeout_ms_admits_at_once_when_the_prefetch_is_over_first():
    scheduler, l3, clock = make("timeout_ms", timeout_ms=250)
    arrive(scheduler, "a")
    l3.started[0][1].finish()
    clock.now += 0.010
    assert admitted(scheduler) == ["a"]
    assert scheduler.cache.take_prefetch_outcomes()[-1].outcome == "completed"


def test_best_effort_never_waits_and_a_held_request_blocks_the_queue_behind_it():
    scheduler, l3, clock = make("best_effort")
    arrive(scheduler, "a")
    assert admitted(scheduler) == ["a"]
    assert scheduler.cache.take_prefetch_outcomes()[-1].outcome == "not_waited"
    scheduler, l3, clock = make("wait")
    arrive(scheduler, "first")
    arrive(scheduler, "second")
    assert admitted(scheduler) == []  # arrival order is kept: "second" waits behind "first"
    l3.started[0][1].finish()
    assert admitted(scheduler) == ["first"]  # "second"'s own prefetch is still running
    l3.started[1][1].finish()
    assert admitted(scheduler) == ["second"]


def test_an_aborted_waiting_request_leaves_no_prefetch_behind():
    scheduler, l3, clock = make("wait")
    arrive(scheduler, "a")
    scheduler.abort("a")
    assert scheduler.cache.prefetch_gate.pending == 0
    scheduler.cache.check_integrity()


def test_no_prefetch_without_an_l3_or_for_a_prompt_of_one_block():
    scheduler, l3, clock = make("wait")
    arrive(scheduler, "short", length=BLOCK)  # no full block before its last token: nothing to fetch
    assert l3.started == [] and admitted(scheduler) == ["short"]
    scheduler.cache.host.prefetcher = None
    arrive(scheduler, "no-l3")
    assert admitted(scheduler) == ["no-l3"]


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(redis_l3_gib=-1, host_cache_gib=1), r"redis_l3_gib: must be a finite number >= 0"),
        (dict(redis_l3_gib=1), r"redis_l3_gib: an L3 sits below a host tier: give --host-cache-gib"),
        (dict(redis_l3_gib=1, host_cache_address="h:1"), r"redis_l3_gib: the node's tier .* own L3"),
        (dict(prefetch_policy="eager"), r"prefetch_policy: 'eager' is not one of best_effort, wait"),
        (dict(prefetch_timeout_ms=-5), r"prefetch_timeout_ms: must be an integer >= 0"),
    ],
    ids=["negative-l3", "l3-without-tier", "l3-with-node-tier", "policy", "negative-timeout"],
)
def test_engine_flags_are_checked_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(model="m", **fields)


L3_FLAGS = ("--host-cache-gib", "1", "--redis-l3-gib", "1")
REDIS = ("--redis-url", "redis://h:1")


def test_worker_and_cache_flags_name_the_flag():
    from cli.cache_command import config_from
    from cli.main import build_parser
    from services.config_flags import worker_config_from_flags

    with pytest.raises(ValueError, match=r"engine.redis_l3_gib: --redis-l3-gib .* give --redis-url"):
        worker_config_from_flags(["--role", "decode", "--model", "m", *L3_FLAGS])
    worker = worker_config_from_flags(["--role", "decode", "--model", "m", *L3_FLAGS, *REDIS])
    assert worker.engine.redis_l3_gib == 1.0
    cache = build_parser()
    with pytest.raises(ValueError, match=r"--redis-l3-gib: the L3 lives in Redis: give --redis-url"):
        config_from(cache.parse_args(["cache", "--kv-gib", "1", "--redis-l3-gib", "1"]))
    with pytest.raises(ValueError, match=r"--redis-l3-gib: must be a finite number >= 0"):
        config_from(cache.parse_args(["cache", "--kv-gib", "1", "--redis-l3-gib", "-1", *REDIS]))
    parsed = cache.parse_args(["cache", "--kv-gib", "1", "--redis-l3-gib", "0.5", *REDIS])
    assert config_from(parsed).l3_budget_bytes == 1 << 29


def test_hold_s_is_how_long_ready_still_says_no():
    scheduler, l3, clock = make("timeout_ms", timeout_ms=250)
    gate = scheduler.cache.prefetch_gate
    arrive(scheduler, "a")
    assert round(gate.hold_s("a"), 6) == 0.25
    clock.now += 0.2
    assert round(gate.hold_s("a"), 6) == 0.05 and gate.hold_s("unknown") is None
    l3.started[0][1].finish()
    assert gate.hold_s("a") is None and gate.pending == 1  # no side effect: ready() ends the entry
    scheduler, l3, clock = make("wait")
    arrive(scheduler, "a")
    assert scheduler.cache.prefetch_gate.hold_s("a") == math.inf


@pytest.mark.parametrize("policy", ["wait", "timeout_ms"])
def test_the_engine_loop_sleeps_while_a_prefetch_holds_the_queue(tiny_checkpoint, policy):
    """The loop makes a bounded number of passes while a prefetch holds the only request (not one per
    poll), and admits it once the prefetch ends (``wait``) or its deadline passes (``timeout_ms``)."""
    config = EngineConfig(
        model=str(tiny_checkpoint("k3")),
        dtype="float32",
        block_size=BLOCK,
        host_cache_gib=0.001,
        prefetch_policy=policy,
        prefetch_timeout_ms=300,
    )
    engine = EngineCore(config)
    engine.cache.host.prefetcher = l3 = StandInL3()
    passes = []
    loop = EngineLoop(engine, after_step=lambda _engine: passes.append(1))
    try:
        params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
        stream = loop.call(lambda e: loop.watch(e.add_request(list(range(30, 42)), params, "held")))
        ((_, prefetch),) = l3.started
        before = len(passes)
        if policy == "wait":
            held = threading.Event()
            assert not held.wait(0.3)  # the loop has 0.3 s to spin in
            assert len(passes) - before <= 2 and stream.empty()
            prefetch.finish()
        first = stream.get(timeout=30)  # admitted: its first token
        assert first.token_ids and prefetch.done() == (policy == "wait")
        assert len(passes) - before <= 4  # the wake-up (or deadline) pass, then the request's steps
        outcome = engine.cache.take_prefetch_outcomes()[-1].outcome
        assert outcome == ("completed" if policy == "wait" else "timed_out")
    finally:
        loop.close()
