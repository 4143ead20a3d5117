"""The draft model's rows in a handoff: a prefill engine with the decode engine's draft prefills the
draft too and writes its blocks and slot in the same transfer; the decode draft's first proposal then
computes only the first token. Greedy tokens stay the plain engine's; a prefill engine without that
draft sends the target's rows only and the decode draft catches up by itself (same tokens, same drafts)."""

import pytest

from common.sampling_params import SamplingParams
from services.engine import LLM
from services.engine.draft_handoff import DraftLayout, reserved_draft
from services.engine.engine_config import EngineConfig
from services.engine.engine_core import EngineCore
from services.engine.handoff import (
    check_layout,
    first_token,
    handoff_row_bytes,
    held_prefill_for,
    layout_of,
    register_pools,
    reservation_of,
    send_state,
)
from services.engine.request import RequestStatus
from services.rpc.convert import reservation_from_pb, reservation_to_pb
from services.transfer import make_backend
from tests.conftest import TEST_DEVICE
from tests.engine.test_draft_model import draft_overrides

ENGINE = {"block_size": 8, "max_num_seqs": 4, "max_num_batched_tokens": 64, "max_model_len": 96}
PROMPTS = [list(range(3, 3 + n)) for n in (17, 5, 30)]
GREEDY = SamplingParams(temperature=0, max_tokens=10, logprobs=0, ignore_eos=True)
K = 3


@pytest.fixture(scope="module")
def models(tiny_checkpoint):
    """``(target, draft)`` checkpoint folders: a tiny k3 and a 2-layer tiny k3 of another seed."""
    return tiny_checkpoint("k3"), tiny_checkpoint("k3", seed=1, **draft_overrides("k3"))


def engine(target, draft=None) -> EngineCore:
    # fixed: every decode step drafts K (the adaptive policy's plain steps would move the first feed)
    spec = (
        {"draft_model": str(draft), "num_draft_tokens": K, "spec_policy": "fixed"}
        if draft is not None
        else {}
    )
    return EngineCore(EngineConfig(model=str(target), device=TEST_DEVICE, dtype="float32", **ENGINE, **spec))


@pytest.fixture(scope="module")
def decode(models):
    return engine(*models)


@pytest.fixture(scope="module")
def reference(models):
    target, _ = models
    plain = LLM(str(target), dtype="float32", device=TEST_DEVICE, enable_prefix_caching=False, **ENGINE)
    return [output.token_ids for output in plain.generate(PROMPTS, GREEDY)]


def fed_tokens(proposer) -> list[int]:
    """Record the tokens each of the draft's batched feeds computes for its first seat."""
    fed, feed = [], proposer._feed

    def recording(seats, tokens):
        fed.append(len(tokens[0]))
        return feed(seats, tokens)

    proposer._feed = recording
    return fed


def hand_off(prefill: EngineCore, decode: EngineCore, prompt: list[int], request_id: str):
    """One request prefilled by ``prefill`` and decoded by ``decode``; returns the decode request, the
    transfer's stats, the held prefill, the draft seat's computed count at the handoff and the draft's
    fed token counts."""
    sender, receiver = make_backend("grpc_bytes"), make_backend("grpc_bytes")
    try:
        register_pools(sender, prefill.cache, prefill.proposer)
        register_pools(receiver, decode.cache, decode.proposer)
        peer = sender.connect(receiver.endpoint())
        check_layout(layout_of(decode), layout_of(prefill))
        reserved = decode.reserve(prompt, GREEDY, request_id)
        rows = reserved_draft(decode.proposer, request_id)
        reservation = reservation_from_pb(
            reservation_to_pb(reservation_of(reserved, layout_of(decode), rows))
        )
        request = prefill.add_prefill_only(prompt, GREEDY, request_id)
        while request.status is not RequestStatus.HELD:
            prefill.step()
        held = held_prefill_for(prefill, request_id, reservation)
        stats = send_state(
            sender, peer, held, reservation, handoff_row_bytes(prefill.cache, prefill.proposer)
        )
        assert receiver.wait_notification(request_id, timeout_s=10).message == request_id
        decode.complete_reserved(request_id, first_token(request), with_draft=held.draft is not None)
        computed_at_handoff = decode.proposer.seats[request_id].num_computed
        prefill.scheduler.release_held(request_id)
        fed = fed_tokens(decode.proposer)
        while decode.has_unfinished:
            decode.step()
        del decode.proposer._feed
    finally:
        sender.close()
        receiver.close()
    return reserved, stats, held, computed_at_handoff, fed


def blocks_of(prompt: list[int], pool) -> int:
    return -(-len(prompt) // pool.block_size)


def target_bytes(decode: EngineCore, request) -> int:
    """The target's rows a handoff sends: the prompt's blocks after the decode engine's own prefix hit
    (the prompts share leading tokens), and the slot."""
    blocks, slots = decode.cache.blocks, decode.cache.slots
    sent = blocks_of(request.prompt_ids, blocks) - request.num_cached_tokens // blocks.block_size
    return sent * blocks.layout.nbytes + slots.layout.nbytes


def spec_totals(decode: EngineCore) -> tuple[int, ...]:
    counts = decode.spec_counters.counts()
    return (*counts.drafted_by_position, *counts.accepted_by_position)


def test_the_draft_rows_travel_with_the_targets(models, decode, reference):
    prefill = engine(*models)
    assert layout_of(prefill).draft == layout_of(decode).draft is not None
    draft = decode.proposer
    for index, (prompt, want) in enumerate(zip(PROMPTS, reference, strict=True)):
        request, stats, held, computed, fed = hand_off(prefill, decode, prompt, f"d{index}")
        assert request.output_ids == want
        assert held.draft is not None and computed == len(prompt)
        assert fed[0] == 1  # the first proposal computed the first token only, not the prompt
        draft_bytes = blocks_of(prompt, draft.blocks) * draft.blocks.layout.nbytes + draft.slots.layout.nbytes
        assert held.draft_nbytes == draft_bytes
        assert stats.nbytes == target_bytes(decode, request) + draft_bytes
    for side in (prefill, decode):
        assert not side.has_unfinished and side.proposer.seats == {}
        side.check_integrity()


@pytest.mark.parametrize("prefill_draft", ["none", "other"])
def test_a_prefill_without_that_draft_leaves_the_decode_draft_to_catch_up(
    models, decode, reference, prefill_draft
):
    target, draft = models
    prefill = engine(target, target if prefill_draft == "other" else None)  # other: the target drafts
    shipped = engine(*models)
    for index, (prompt, want) in enumerate(zip(PROMPTS, reference, strict=True)):
        before = spec_totals(decode)
        request, stats, held, computed, fed = hand_off(prefill, decode, prompt, f"c{prefill_draft}{index}")
        assert request.output_ids == want
        assert held.draft is None and computed == 0
        assert fed[0] == len(prompt) + 1  # the prompt and the first token, in the first proposal
        assert stats.nbytes == target_bytes(decode, request)
        # The same drafts as with the draft's rows handed over: that state is the one it computes.
        caught_up = [a - b for a, b in zip(spec_totals(decode), before, strict=True)]
        assert sum(caught_up) > 0
        before = spec_totals(decode)
        hand_off(shipped, decode, prompt, f"s{prefill_draft}{index}")
        assert [a - b for a, b in zip(spec_totals(decode), before, strict=True)] == caught_up
    for side in (prefill, decode):
        assert not side.has_unfinished
        side.check_integrity()
    assert decode.proposer.seats == {}


def test_a_reservation_holds_its_draft_seat_until_freed(decode):
    reserved = decode.reserve(PROMPTS[2], GREEDY, "held-seat")
    rows = reserved_draft(decode.proposer, "held-seat")
    seat = decode.proposer.seats["held-seat"]
    assert rows.block_ids == tuple(seat.block_table)
    assert len(rows.block_ids) == blocks_of(PROMPTS[2], decode.proposer.blocks)
    assert rows.slot == seat.slot and seat.num_computed == 0
    sent = reservation_from_pb(reservation_to_pb(reservation_of(reserved, layout_of(decode), rows)))
    assert sent.draft == rows and sent.layout.draft == layout_of(decode).draft
    decode.abort("held-seat")
    assert decode.proposer.seats == {}
    decode.check_integrity()


def test_a_draft_layout_that_differs_is_not_refused(decode):
    theirs = layout_of(decode)
    other = DraftLayout("another-draft", theirs.draft.block_size, "x", "y")
    check_layout(theirs.__class__(**{**theirs.__dict__, "draft": other}), theirs)
