"""Decode keeps its own hits: a reservation keeps the prompt blocks the decode engine already holds (in
its device pool, or in its host tier, loaded at Reserve), says so in ``cached_tokens``, and the handoff
writes only the blocks after them (and the KDA slot whole). The output equals one engine's."""

import pytest

from services.engine import LLM
from services.engine.engine_config import EngineConfig
from services.engine.engine_core import EngineCore
from services.engine.handoff import (
    Reservation,
    check_decode_hit,
    first_token,
    handoff_row_bytes,
    held_prefill,
    layout_of,
    register_pools,
    reservation_of,
    send_state,
)
from services.engine.request import RequestStatus
from services.transfer import make_backend
from tests.hicache.test_engine_host_cache import ENGINE_ARGS, FILLER, GREEDY, TURN1

TURN2 = TURN1[:24] + list(range(500, 510))  # turn 1's 3 full blocks of 8, then 10 new tokens: 5 blocks


@pytest.fixture(scope="module")
def reference(tiny_checkpoint):
    """TURN2's greedy tokens and log-probs from one engine without any cache."""
    llm = LLM(str(tiny_checkpoint("k3")), enable_prefix_caching=False, **ENGINE_ARGS)
    (output,) = llm.generate([TURN2], GREEDY)
    return output


def make_pair(tiny_checkpoint, **decode_args):
    """A prefill and a decode engine on the tiny K3 checkpoint, joined by the grpc_bytes backend."""
    path = str(tiny_checkpoint("k3"))
    prefill = EngineCore(EngineConfig(model=path, **ENGINE_ARGS))
    decode = EngineCore(EngineConfig(model=path, **ENGINE_ARGS, **decode_args))
    sender, receiver = make_backend("grpc_bytes"), make_backend("grpc_bytes")
    register_pools(sender, prefill.cache)
    register_pools(receiver, decode.cache)
    return prefill, decode, sender, receiver, sender.connect(receiver.endpoint())


def handoff(pair, prompt, request_id):
    """Reserve, prefill, send, decode; returns (decode's request, its reservation, transfer stats)."""
    prefill, decode, sender, receiver, peer = pair
    reserved = decode.reserve(prompt, GREEDY, request_id)
    reservation = reservation_of(reserved, layout_of(decode))
    held = prefill.add_prefill_only(prompt, GREEDY, request_id)
    while held.status is not RequestStatus.HELD:
        prefill.step()
    stats = send_state(sender, peer, held_prefill(held), reservation, handoff_row_bytes(prefill.cache, None))
    assert receiver.wait_notification(request_id, timeout_s=10).message == request_id
    decode.scheduler.complete_reserved(request_id, first_token(held))
    prefill.scheduler.release_held(request_id)
    while decode.has_unfinished:
        decode.step()
    return reserved, reservation, stats


def assert_equal_output(request, want):
    assert request.output_ids == want.token_ids
    assert max(abs(a - b) for a, b in zip(request.logprobs, want.logprobs, strict=True)) < 1e-4


def sent_bytes(engine, blocks: int) -> int:
    return blocks * engine.cache.blocks.layout.nbytes + engine.cache.slots.layout.nbytes


def test_decode_keeps_its_device_hit_and_only_the_suffix_is_sent(tiny_checkpoint, reference):
    pair = make_pair(tiny_checkpoint)
    prefill, decode, sender, receiver, _ = pair
    try:
        first, reservation, stats = handoff(pair, TURN1, "turn1")
        assert reservation.cached_tokens == 0 and stats.nbytes == sent_bytes(prefill, 4)
        held_blocks = [decode.cache.blocks.lookup(h) for h in first.block_hashes[:3]]
        assert None not in held_blocks

        second, reservation, stats = handoff(pair, TURN2, "turn2")
        assert reservation.cached_tokens == second.num_cached_tokens == 24
        assert second.num_cached_tokens_host == 0
        assert list(reservation.block_ids[:3]) == held_blocks  # shared, not reserved anew
        assert stats.nbytes == sent_bytes(prefill, 2)  # blocks 3 and 4, and the slot
        assert_equal_output(second, reference)
        for engine in (prefill, decode):
            assert not engine.has_unfinished
            engine.check_integrity()
    finally:
        sender.close()
        receiver.close()


def test_decode_loads_its_hit_from_its_host_tier_at_reserve(tiny_checkpoint, reference):
    pair = make_pair(tiny_checkpoint, num_blocks=8, host_cache_gib=0.01)
    prefill, decode, sender, receiver, _ = pair
    try:
        handoff(pair, TURN1, "turn1")
        decode.add_request(FILLER, GREEDY, "filler")  # evicts turn 1's blocks: offloaded to the tier
        while decode.has_unfinished:
            decode.step()

        second, reservation, stats = handoff(pair, TURN2, "turn2")
        assert reservation.cached_tokens == second.num_cached_tokens == 24
        assert second.num_cached_tokens_host == 24  # loaded from the tier into fresh device blocks
        assert stats.nbytes == sent_bytes(prefill, 2)
        assert_equal_output(second, reference)
        decode.check_integrity()
    finally:
        sender.close()
        receiver.close()


def test_a_reservation_whose_hit_is_not_whole_blocks_is_refused(tiny_checkpoint):
    layout = layout_of(EngineCore(EngineConfig(model=str(tiny_checkpoint("k3")), **ENGINE_ARGS)))
    for cached in (5, 40):
        reservation = Reservation("r", (0, 1, 2, 3, 4), 0, layout, cached)
        with pytest.raises(ValueError, match=rf"reservation.cached_tokens: {cached} is not a whole number"):
            check_decode_hit(reservation, len(TURN2))
    check_decode_hit(Reservation("r", (0, 1, 2, 3, 4), 0, layout, 32), len(TURN2))


def test_an_aborted_reservation_leaves_its_hit_s_state_snapshot_alone(tiny_checkpoint, reference):
    """A refused handoff: the reservation (its own hit 24 tokens, a block boundary) is aborted with
    whatever bytes landed in its slot, and the decode engine prefills the prompt itself. Those bytes must
    not become the snapshot of the hit's state (which the local prefill would restore)."""
    pair = make_pair(tiny_checkpoint)
    prefill, decode, sender, receiver, _ = pair
    try:
        handoff(pair, TURN1, "turn1")
        reserved = decode.reserve(TURN2, GREEDY, "refused")
        assert reserved.num_cached_tokens == 24
        decode.cache.slots.storage[reserved.slot] = 0x5A  # what a refused handoff left there
        decode.abort("refused")
        again = decode.add_request(TURN2, GREEDY, "refused")
        while decode.has_unfinished:
            decode.step()
        assert_equal_output(again, reference)
        decode.check_integrity()
    finally:
        sender.close()
        receiver.close()
