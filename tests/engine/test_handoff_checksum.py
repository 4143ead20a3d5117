"""The handoff checksum (``services/engine/handoff_checksum.py``) between two engines joined by a real
backend: the decode side's ``arrived_checksum`` equals the prefill side's ``sent_checksum`` under the
reservation's capability, and differs under another capability or once a stray write lands in the
reservation. (The hash itself: ``tests/kernels/device/test_keyed_checksum.py``.)"""

import dataclasses

import pytest

from services.engine import SamplingParams
from services.engine.engine_config import EngineConfig
from services.engine.engine_core import EngineCore
from services.engine.handoff import (
    arrived_checksum,
    handoff_tag,
    held_prefill,
    register_pools,
    reservation_of,
    send_state,
    sent_checksum,
)
from services.engine.request import RequestStatus
from services.transfer import BLOCKS, make_backend
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


def test_the_decode_side_hashes_what_the_prefill_side_sent_and_sees_a_stray_write(pair):
    prefill, decode, sender, receiver, peer = pair
    prompt, params, capability = list(range(7, 47)), SamplingParams(max_tokens=2), "c0ffee" * 5
    reserved = decode.reserve(prompt, params, "victim")
    reservation = dataclasses.replace(reservation_of(reserved), capability=capability)
    request = prefill.add_prefill_only(prompt, params, "victim")
    while request.status is not RequestStatus.HELD:
        prefill.step()
    held = held_prefill(request)
    send_state(sender, peer, held, reservation)
    assert (
        receiver.wait_notification(handoff_tag("victim", capability), 10).peer == sender.endpoint().agent_name
    )
    sent = sent_checksum(prefill, held, reservation)
    assert arrived_checksum(decode, "victim", capability, with_draft=False) == sent
    assert arrived_checksum(decode, "victim", "feed" * 8, with_draft=False) != sent  # another key
    # A stray write over the reservation's first block (another block's bytes of the prefill pool).
    stray = next(block for block in range(prefill.cache.blocks.num_blocks) if block not in held.block_ids)
    sender.write(peer, {BLOCKS: [(stray, reservation.block_ids[0])]}, message="stray")
    receiver.wait_notification("stray", 10)
    assert arrived_checksum(decode, "victim", capability, with_draft=False) != sent
    prefill.scheduler.release_held("victim")
    decode.abort("victim")
    prefill.check_integrity()
    decode.check_integrity()
