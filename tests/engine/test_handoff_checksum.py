"""The handoff checksum (``services/engine/handoff_checksum.py``) between two engines joined by a real
backend: the decode side's ``arrived_checksum`` parts add up to the prefill side's ``sent_checksum``
under the reservation's capability (one part, or several when the handoff is written in parts, each
with its own notification), and differ under another capability or once a stray write lands in the
reservation. (The hash itself: ``tests/kernels/device/test_keyed_checksum.py``.)"""

import dataclasses

import pytest

from services.engine import SamplingParams, handoff
from services.engine.engine_config import EngineConfig
from services.engine.engine_core import EngineCore
from services.engine.handoff import (
    arrived_checksum,
    arrived_parts,
    handoff_row_bytes,
    handoff_tag,
    held_prefill,
    part_tag,
    register_pools,
    reservation_of,
    send_state,
    sent_checksum,
)
from services.engine.request import RequestStatus
from services.transfer import BLOCKS, STATE, make_backend
from tests.conftest import TEST_DEVICE


@pytest.fixture(scope="module")
def pair(tiny_checkpoint):
    options = dict(model=str(tiny_checkpoint("k3")), device=TEST_DEVICE, dtype="float32")
    prefill, decode = EngineCore(EngineConfig(**options)), EngineCore(EngineConfig(**options))
    sender, receiver = make_backend("grpc_bytes"), make_backend("grpc_bytes")
    register_pools(sender, prefill.cache)
    register_pools(receiver, decode.cache)
    yield prefill, decode, sender, receiver, sender.connect(receiver.endpoint())
    sender.close()
    receiver.close()


def _arrived(decode, request_id, capability) -> int:
    parts = arrived_parts(decode, request_id, with_draft=False)
    return sum(arrived_checksum(decode, part, capability) for part in parts) % (1 << 64)


@pytest.mark.parametrize("part_bytes", [handoff.PART_BYTES, 1], ids=["one-part", "a-part-a-row"])
def test_the_decode_side_hashes_what_the_prefill_side_sent_and_sees_a_stray_write(
    pair, part_bytes, monkeypatch
):
    prefill, decode, sender, receiver, peer = pair
    monkeypatch.setattr(handoff, "PART_BYTES", part_bytes)
    prompt, params, capability = list(range(7, 47)), SamplingParams(max_tokens=2), "c0ffee" * 5
    reserved = decode.reserve(prompt, params, "victim")
    reservation = dataclasses.replace(reservation_of(reserved), capability=capability)
    request = prefill.add_prefill_only(prompt, params, "victim")
    while request.status is not RequestStatus.HELD:
        prefill.step()
    held = held_prefill(request)
    sent = send_state(sender, peer, held, reservation, handoff_row_bytes(prefill.cache, None))
    rows = len(reservation.block_ids) + 1  # every block (no decode hit) and the slot
    assert sent.parts == (1 if part_bytes > 1 else rows)
    for part in range(sent.parts):  # each part notified, the last one with the handoff's tag
        tag = part_tag("victim", capability, part, sent.parts)
        assert receiver.wait_notification(tag, 10).peer == sender.endpoint().agent_name
    assert part_tag("victim", capability, sent.parts - 1, sent.parts) == handoff_tag("victim", capability)
    want = sent_checksum(prefill, held, reservation)
    assert len(arrived_parts(decode, "victim", with_draft=False)) == sent.parts  # split alike
    assert _arrived(decode, "victim", capability) == want
    assert _arrived(decode, "victim", "feed" * 8) != want  # another key
    # A stray write over the reservation's first block (another block's bytes of the prefill pool).
    stray = next(block for block in range(prefill.cache.blocks.num_blocks) if block not in held.block_ids)
    sender.write(peer, {BLOCKS: [(stray, reservation.block_ids[0])]}, message="stray")
    receiver.wait_notification("stray", 10)
    assert _arrived(decode, "victim", capability) != want
    prefill.scheduler.release_held("victim")
    decode.abort("victim")
    prefill.check_integrity()
    decode.check_integrity()


def test_parts_are_contiguous_slices_in_region_order_with_the_whole_numbering():
    rows = {STATE: [9], BLOCKS: [4, 5, 6]}
    sizes = {BLOCKS: 40, STATE: 100}
    parts = handoff.handoff_parts(rows, sizes, part_bytes=80)
    assert [part.rows for part in parts] == [{BLOCKS: [4, 5]}, {BLOCKS: [6]}, {STATE: [9]}]
    assert [part.start_word for part in parts] == [0, 20, 30]  # words of 4 bytes before each part
    assert [p.rows for p in handoff.handoff_parts(rows, sizes, part_bytes=1000)] == [
        {BLOCKS: [4, 5, 6], STATE: [9]}
    ]
