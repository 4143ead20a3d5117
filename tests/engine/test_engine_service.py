"""``EngineService``: snapshots only, one load per pass, reserve-or-decline, prefill's layout check."""

import dataclasses

import pytest

from services.engine import SamplingParams
from services.engine.engine_config import EngineConfig
from services.engine.engine_core import EngineCore
from services.engine.engine_service import EngineService, prefill_here
from services.engine.handoff import Reservation
from tests.conftest import TEST_DEVICE

PROMPT = list(range(11, 48))


@pytest.fixture(scope="module")
def service(tiny_checkpoint):
    config = EngineConfig(model=str(tiny_checkpoint("k3")), device=TEST_DEVICE, dtype="float32")
    engine = EngineService(EngineCore(config))
    passes = []
    engine.observe(passes.append)
    yield engine, passes
    engine.close()


def test_reserve_declines_a_short_prompt_and_holds_room_for_a_long_one(service):
    engine, passes = service
    declined = engine.reserve(PROMPT[:4], SamplingParams(), "short", local_prefill_max_tokens=8)
    assert declined.prefill_locally and declined.cached_tokens == 0
    held = engine.reserve(PROMPT, SamplingParams(), "long", local_prefill_max_tokens=8)
    reservation = held.reservation
    assert reservation.layout == engine.layout and len(reservation.block_ids) == 3
    assert passes[-1].load.running == 1 and passes[-1].load.used_blocks == 3  # the command's own pass
    with pytest.raises(dataclasses.FrozenInstanceError):
        reservation.slot = 0
    assert engine.free_reservation("long").result(timeout=10) is True
    assert engine.free_reservation("long").result(timeout=10) is False  # already gone
    state = engine.integrity()
    assert state.ok and (state.used_blocks, state.used_slots, state.request_ids) == (0, 0, ())


def test_prefill_refuses_another_layout_before_any_work_then_hands_off_a_snapshot(service):
    engine, passes = service
    other = dataclasses.replace(engine.layout, kv_format="fp8")
    with pytest.raises(
        ValueError, match=r"reservation\.layout\.kv_format: decode worker has fp8, .* has auto"
    ):
        engine.prefill(PROMPT, SamplingParams(), Reservation("p", (0, 1, 2), 0, other))
    assert engine.integrity().request_ids == ()
    stream = engine.prefill(
        PROMPT, SamplingParams(max_tokens=4), Reservation("p", (0, 1, 2), 0, engine.layout)
    )
    while stream.get(timeout=60).finish_reason is None:
        pass
    held = engine.held_prefill("p")
    assert len(held.block_ids) == 3 and held.first.token_id >= 0
    assert engine.integrity().held == 1
    engine.discard("p")
    assert engine.integrity().used_blocks == 0 and not engine.has_unfinished()


def test_prefill_here_takes_a_short_remainder_or_a_full_hit():
    assert prefill_here(40, 0, 64, 16) and not prefill_here(400, 0, 64, 16)
    assert prefill_here(400, 390, 0, 16) and not prefill_here(400, 0, 0, 16)
