"""The baton handoff between two engines: prefill computes, its state is written into decode's
reservation through a real transfer backend, decode continues; outputs equal one engine's."""

import numpy as np
import pytest

from common.errors import NoCapacity
from services.engine import LLM, SamplingParams
from services.engine.engine_config import EngineConfig
from services.engine.engine_core import EngineCore
from services.engine.handoff import (
    check_layout,
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
from tests.conftest import TEST_DEVICE

PROMPTS = [list(range(11, 11 + n)) for n in (37, 16, 5)]


def bits(values):
    return np.asarray(values, dtype=np.float32).view(np.int32).tolist()


@pytest.fixture(scope="module", params=[False, True], ids=["default", "batch-invariant"])
def pair(request, tiny_checkpoint):
    """A prefill engine and a decode engine on one K3 checkpoint, joined by the grpc_bytes backend."""
    options = dict(
        model=str(tiny_checkpoint("k3")),
        device=TEST_DEVICE,
        dtype="float32",
        batch_invariant=request.param,
        max_num_batched_tokens=24,
    )
    prefill, decode = EngineCore(EngineConfig(**options)), EngineCore(EngineConfig(**options))
    check_layout(layout_of(decode), layout_of(prefill))  # raises on a mismatch
    sender, receiver = make_backend("grpc_bytes"), make_backend("grpc_bytes")
    register_pools(sender, prefill.cache)
    register_pools(receiver, decode.cache)
    peer = sender.connect(receiver.endpoint())
    yield prefill, decode, sender, receiver, peer, request.param
    sender.close()
    receiver.close()


def handoff(pair, prompt, params, request_id):
    prefill, decode, sender, receiver, peer, _ = pair
    reserved = decode.reserve(prompt, params, request_id)
    held = prefill.add_prefill_only(prompt, params, request_id)
    while held.status is not RequestStatus.HELD:
        prefill.step()
    stats = send_state(
        sender, peer, held_prefill(held), reservation_of(reserved), handoff_row_bytes(prefill.cache, None)
    )
    assert receiver.wait_notification(request_id, timeout_s=10).message == request_id
    decode.scheduler.complete_reserved(request_id, first_token(held))
    prefill.scheduler.release_held(request_id)
    while decode.has_unfinished:
        decode.step()
    return reserved, stats


def test_handoff_output_equals_a_single_engine(pair):
    prefill, decode, *_, invariant = pair
    params = SamplingParams(max_tokens=6, temperature=0, logprobs=0, ignore_eos=True)
    reference = LLM(
        prefill.config.model,
        device=TEST_DEVICE,
        dtype="float32",
        batch_invariant=invariant,
        enable_prefix_caching=False,
    ).generate(PROMPTS, params)
    for index, (prompt, want) in enumerate(zip(PROMPTS, reference, strict=True)):
        request, stats = handoff(pair, prompt, params, f"r{index}")
        assert request.output_ids == want.token_ids
        block_bytes = prefill.cache.blocks.layout.nbytes
        assert stats.nbytes == -(-len(prompt) // 16) * block_bytes + prefill.cache.slots.layout.nbytes
        if invariant:
            assert bits(request.logprobs) == bits(want.logprobs)
        else:
            assert max(abs(a - b) for a, b in zip(request.logprobs, want.logprobs, strict=True)) < 1e-4
    for engine in (prefill, decode):
        assert not engine.has_unfinished
        engine.check_integrity()


def test_reservation_can_be_aborted_and_refused(pair):
    prefill, decode, *_ = pair
    params = SamplingParams(max_tokens=4)
    decode.reserve(PROMPTS[0], params, "gone")
    decode.abort("gone")
    decode.check_integrity()
    assert decode.cache.blocks.num_free == decode.cache.blocks.num_blocks
    seats = decode.config.max_num_seqs
    for index in range(seats):
        decode.reserve([1, 2], params, f"seat{index}")
    with pytest.raises(NoCapacity, match="no room"):
        decode.reserve([1, 2], params, "one-too-many")
    for index in range(seats):
        decode.abort(f"seat{index}")
    held = prefill.add_prefill_only(PROMPTS[1], params, "held")
    while held.status is not RequestStatus.HELD:
        prefill.step()
    with pytest.raises(ValueError, match="is not reserved"):
        reservation_of(held)
    prefill.scheduler.release_held("held")
    prefill.check_integrity()
    decode.check_integrity()
