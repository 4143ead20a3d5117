"""Scheduler on real pools with tiny sizes: exact chunks, block ids, preemption order, aborts, leaks."""

import pytest
import torch

from common.sampling_params import SamplingParams
from services.engine.cache.block_pool import BlockPool
from services.engine.cache.layout import block_layout, slot_layout
from services.engine.cache.state_pool import StateSlotPool
from services.engine.cache_manager import CacheManager
from services.engine.checkpoint.presets import preset_config
from services.engine.model.config_loader import load_model_config
from services.engine.request import Request
from services.engine.scheduler import SampledToken, Scheduler

EOS = 9


def make_scheduler(num_blocks=8, slots=4, max_num_seqs=4, budget=16, max_model_len=64, block=4):
    config = load_model_config(preset_config("k3", "tiny"))
    cache = CacheManager(
        BlockPool(block_layout(config, block, torch.float32), block, num_blocks, "cpu"),
        StateSlotPool(slot_layout(config, torch.float32), slots, "cpu"),
    )
    return Scheduler(cache, max_num_seqs, budget, max_model_len)


def request(name, prompt_len, max_tokens=4, **params):
    return Request(
        name,
        list(range(100, 100 + prompt_len)),
        SamplingParams(max_tokens=max_tokens, **params),
        frozenset({EOS}),
    )


def run_step(scheduler, token=1, tokens=None):
    """Schedule and apply one step, sampling ``tokens[request_id]`` (default ``token``)."""
    output = scheduler.schedule()
    tokens = tokens or {}
    sampled = {
        c.request_id: SampledToken(tokens.get(c.request_id, token), None, None)
        for c in output.chunks
        if c.samples
    }
    return output, scheduler.update(output, sampled)


def test_chunked_prefill_under_budget_then_decode():
    scheduler = make_scheduler(budget=16)
    scheduler.add(request("a", 10))
    scheduler.add(request("b", 9))
    output, _ = run_step(scheduler)
    assert [(c.request_id, len(c.token_ids), c.past, c.block_table, c.samples) for c in output.chunks] == [
        ("a", 10, 0, (0, 1, 2), True),
        ("b", 6, 0, (3, 4), False),
    ]
    output, _ = run_step(scheduler)
    assert [(c.request_id, c.token_ids, c.past, c.block_table) for c in output.chunks] == [
        ("a", (1,), 10, (0, 1, 2)),  # decode of the sampled token
        ("b", tuple(range(106, 109)), 6, (3, 4, 5)),
    ]
    scheduler.cache.check_integrity()


def test_max_num_seqs_limits_admission():
    scheduler = make_scheduler(max_num_seqs=2, budget=64, num_blocks=16)
    for name in "abc":
        scheduler.add(request(name, 3))
    output, _ = run_step(scheduler)
    assert [c.request_id for c in output.chunks] == ["a", "b"]
    assert [r.request_id for r in scheduler.waiting] == ["c"]


def test_stop_reasons_and_release():
    scheduler = make_scheduler()
    scheduler.add(request("eos", 3, max_tokens=10))
    scheduler.add(request("stop-id", 3, max_tokens=10, stop_token_ids=[7]))
    scheduler.add(request("length", 3, max_tokens=2))
    scheduler.add(request("ignore", 3, max_tokens=2, ignore_eos=True))
    _, finished = run_step(scheduler, token=3, tokens={"eos": EOS, "ignore": EOS})
    assert {r.request_id: r.finish_reason.value for r in finished} == {"eos": "stop"}
    _, finished = run_step(scheduler, token=3, tokens={"stop-id": 7, "ignore": EOS})
    assert {r.request_id: r.finish_reason.value for r in finished} == {
        "stop-id": "stop",
        "length": "length",
        "ignore": "length",
    }
    assert not scheduler.has_unfinished
    scheduler.cache.check_integrity()
    assert scheduler.cache.blocks.num_free == scheduler.cache.blocks.num_blocks


def test_preemption_recomputes_latest_request_and_loses_nothing():
    scheduler = make_scheduler(num_blocks=5, budget=32, block=4)
    scheduler.add(request("old", 7, max_tokens=6))
    scheduler.add(request("new", 8, max_tokens=6))
    run_step(scheduler)  # old: blocks 0,1 ; new: blocks 2,3 ; one block free
    old, new = scheduler.requests["old"], scheduler.requests["new"]
    assert old.block_table == [0, 1] and new.block_table == [2, 3]
    run_step(scheduler)  # old reaches 8 cached tokens, new needs a 3rd block: takes block 4
    assert new.block_table == [2, 3, 4]
    output, _ = run_step(scheduler)  # old needs a 3rd block at token 9: none left, "new" is preempted
    assert output.preempted == ("new",)
    assert [c.request_id for c in output.chunks] == ["old"]
    assert new.block_table == [] and new.slot is None and new.num_computed == 0
    assert new.output_ids == [1, 1] and scheduler.waiting[0] is new
    scheduler.cache.check_integrity()
    scheduler.abort("old")
    output, _ = run_step(scheduler)  # recompute: the whole prompt and both outputs in one chunk
    assert output.chunks[0].token_ids == tuple(range(100, 108)) + (1, 1) and output.chunks[0].samples
    assert new.output_ids == [1, 1, 1]


@pytest.mark.parametrize("when", ["waiting", "mid-prefill", "decoding"])
def test_abort_at_any_point_frees_everything(when):
    scheduler = make_scheduler(budget=8)
    scheduler.add(request("a", 12, max_tokens=10))
    if when != "waiting":
        run_step(scheduler)  # 8 of 12 prompt tokens
    if when == "decoding":
        run_step(scheduler)
        run_step(scheduler)
        assert scheduler.requests["a"].output_ids
    aborted = scheduler.abort("a")
    assert aborted.finish_reason.value == "abort"
    assert not scheduler.has_unfinished
    scheduler.cache.check_integrity()
    assert scheduler.cache.blocks.num_free == scheduler.cache.blocks.num_blocks
    assert scheduler.cache.slots.num_free == scheduler.cache.slots.num_slots
    assert scheduler.abort("a") is None


def test_aborted_during_step_is_not_advanced():
    scheduler = make_scheduler()
    scheduler.add(request("a", 3))
    output = scheduler.schedule()
    scheduler.abort("a")
    assert scheduler.update(output, {"a": SampledToken(1, None, None)}) == []


def test_requests_that_cannot_fit_are_rejected_up_front():
    scheduler = make_scheduler(num_blocks=4, block=4, max_model_len=64)
    with pytest.raises(
        ValueError, match=r"prompt \+ max_tokens: 19 tokens exceed the whole cache \(16 tokens\)"
    ):
        scheduler.add(request("big", 10, max_tokens=10))
    with pytest.raises(ValueError, match="max_model_len"):
        make_scheduler(max_model_len=8).add(request("long", 8))
    with pytest.raises(ValueError, match="at least one token"):
        scheduler.add(request("empty", 0))
    scheduler.add(request("dup", 2))
    with pytest.raises(ValueError, match="already in flight"):
        scheduler.add(request("dup", 2))
    scheduler.cache.check_integrity()


def test_queue_time_is_recorded_once_when_a_request_first_runs():
    scheduler = make_scheduler(num_blocks=5, budget=32, block=4, max_num_seqs=1)
    scheduler.add(request("first", 7, max_tokens=2))
    scheduler.add(request("second", 7, max_tokens=2))
    waited_for = scheduler.requests["second"]
    waited_for.arrival_time -= 5.0  # as if it had arrived five seconds ago
    run_step(scheduler)
    assert len(scheduler.take_queue_times()) == 1  # only "first" started
    assert scheduler.take_queue_times() == []  # taken
    run_step(scheduler)  # "first" finishes; "second" starts next step
    run_step(scheduler)
    (queued,) = scheduler.take_queue_times()
    assert queued >= 5.0 and waited_for.queue_seconds == queued


def test_a_reservation_whose_state_never_arrives_expires():
    scheduler = make_scheduler(num_blocks=8, budget=32, block=4)
    fresh, stale = request("fresh", 6), request("stale", 6)
    scheduler.reserve(fresh)
    scheduler.reserve(stale)
    assert scheduler.expire_reserved(60.0, now=stale.arrival_time + 30) == []
    stale.arrival_time -= 100
    assert scheduler.expire_reserved(60.0, now=fresh.arrival_time + 30) == ["stale"]
    assert list(scheduler.reserved) == ["fresh"] and stale.finish_reason.value == "abort"
    scheduler.abort("fresh")
    scheduler.cache.check_integrity()
    assert scheduler.cache.blocks.num_free == scheduler.cache.blocks.num_blocks
