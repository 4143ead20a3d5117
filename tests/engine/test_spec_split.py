"""A verify step's host side: the ``SpecSplit`` a step with drafts carries (rows, sub-steps, slot
pairs), none on a plain step, clear errors on bad drafts, no CUDA-graph replay of it, and the
state pool's whole-slot copy."""

import pytest
import torch

from services.engine.cache.layout import Layout, slot_layout
from services.engine.cache.state_pool import StateSlotPool
from services.engine.cuda_graphs import DecodeGraphs
from services.engine.model import SequenceStep, build_step_metadata
from services.engine.model.config_loader import load_model_config

BLOCK = 4
DECODE = SequenceStep(token_ids=(21,), past=6, block_table=(5, 1), slot=0)
PREFILL = SequenceStep(token_ids=(31, 32, 33), past=0, block_table=(3,), slot=2)
SHORT = SequenceStep((41, 42, 43), past=9, block_table=(6, 7, 8), slot=1, num_draft=2, checkpoint_slot=7)
LONG = SequenceStep(
    (51, 52, 53, 54, 55, 56, 57), past=2, block_table=(9, 10, 11), slot=3, num_draft=4, checkpoint_slot=6
)


def test_a_step_with_drafts_splits_tails_from_drafts():
    """Rows: decode 0 | short tail 1, drafts 2-3 | prefill 4-6 | long tail 7-9, drafts 10-13."""
    meta = build_step_metadata([DECODE, SHORT, PREFILL, LONG], BLOCK, "cpu")
    spec = meta.spec
    assert spec.head_rows.tolist() == [0, 1, 4, 5, 6, 7, 8, 9]
    assert spec.draft_rows.tolist() == [2, 3, 10, 11, 12, 13]
    assert spec.slots.tolist() == [1, 3] and spec.checkpoint_slots.tolist() == [7, 6]
    heads, drafts = spec.heads, spec.drafts
    assert heads.input_ids.tolist() == [21, 41, 31, 32, 33, 51, 52, 53]
    assert heads.query_start_loc.tolist() == [0, 1, 2, 5, 8]
    assert heads.past_lens.tolist() == [6, 9, 0, 2] and heads.kda_slots.tolist() == [0, 1, 2, 3]
    assert heads.has_state.tolist() == [True, True, False, True] and heads.any_fresh
    assert drafts.input_ids.tolist() == [42, 43, 54, 55, 56, 57]
    assert drafts.query_start_loc.tolist() == [0, 2, 6]
    assert drafts.past_lens.tolist() == [10, 5] and drafts.positions.tolist() == [10, 11, 5, 6, 7, 8]
    assert drafts.kda_slots.tolist() == [1, 3] and drafts.has_state.tolist() == [True, True]
    assert (drafts.max_query_len, drafts.any_fresh) == (4, False)
    assert heads.spec is None and drafts.spec is None
    # The whole step is the same as without the drafts marked.
    plain = build_step_metadata([DECODE, SHORT, PREFILL, LONG], BLOCK, "cpu")
    assert torch.equal(meta.packed, plain.packed)


def test_a_step_without_drafts_has_no_split_and_the_same_bytes():
    unmarked = [SequenceStep(s.token_ids, s.past, s.block_table, s.slot) for s in (DECODE, SHORT, LONG)]
    marked = [DECODE, SHORT, LONG]
    meta = build_step_metadata(unmarked, BLOCK, "cpu", index_topk=8)
    assert meta.spec is None
    assert torch.equal(meta.packed, build_step_metadata(marked, BLOCK, "cpu", index_topk=8).packed)


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"num_draft": 3},
            r"steps\[1\]\.num_draft: 3 drafts in 3 tokens; it must be in \[0, len\(token_ids\)\)",
        ),
        ({"num_draft": -1}, r"steps\[1\]\.num_draft: -1 drafts"),
        (
            {"checkpoint_slot": -1},
            r"steps\[1\]\.checkpoint_slot: a sequence with drafts needs a checkpoint slot",
        ),
        (
            {"checkpoint_slot": 0},
            r"checkpoint slots \[0, 6\] must be distinct and none may be a sequence's slot",
        ),
        ({"checkpoint_slot": 6}, r"checkpoint slots \[6, 6\] must be distinct"),
    ],
    ids=["no-tail", "negative", "no-checkpoint", "checkpoint-is-a-slot", "shared-checkpoint"],
)
def test_bad_drafts_are_refused_naming_the_field(changes, message):
    short = SequenceStep(**{**SHORT.__dict__, **changes})
    with pytest.raises(ValueError, match=message):
        build_step_metadata([DECODE, short, LONG], BLOCK, "cpu")


def test_decode_graphs_never_replay_a_step_with_drafts_and_verify_graphs_only_theirs():
    """Only the replay check, on graph sets of sizes 1..4 (nothing captured: no GPU needed): decode
    graphs take one-token steps; the verify graphs of k = 1 take steps of 1 + 1 tokens whose draft has
    its slot (``--kda-rollback states``), every row a logits row."""
    decode, verify = DecodeGraphs.__new__(DecodeGraphs), DecodeGraphs.__new__(DecodeGraphs)
    for graphs, k in ((decode, 0), (verify, 1)):
        graphs.graphs, graphs.max_seq_len, graphs.num_draft = {1: None, 2: None, 4: None}, 64, k
    tail_only = SequenceStep((41,), past=9, block_table=(6, 7, 8), slot=1)
    one_draft = SequenceStep((41, 42), past=9, block_table=(6, 7, 8), slot=1, num_draft=1, checkpoint_slot=7)
    with_slot = SequenceStep((41, 42), past=9, block_table=(6, 7, 8), slot=1, num_draft=1, draft_slots=(7,))
    other = SequenceStep((43, 44), past=4, block_table=(2,), slot=2, num_draft=1, draft_slots=(8,))
    assert decode.can_replay([DECODE, tail_only], 2)
    assert not decode.can_replay([DECODE, one_draft], 2)
    assert verify.can_replay([with_slot, other], 4)
    assert not verify.can_replay([with_slot, other], 2)  # the tail rows too
    assert not verify.can_replay([one_draft, other], 4)  # a checkpoint slot: replay mode, eager
    assert not verify.can_replay([DECODE, other], 3)


@pytest.fixture
def pool(tiny_checkpoint):
    config = load_model_config(tiny_checkpoint("kimi_linear"))
    layout = slot_layout(config, torch.float32, open_chunk_rows=16)
    slots = StateSlotPool(layout, num_slots=4, device="cpu")
    for _ in range(3):
        slots.allocate()
    return slots


def test_copy_slot_copies_every_field_of_every_layer(pool):
    layout: Layout = pool.layout
    assert len({field.layer for field in layout.fields}) > 1 and len({f.kind for f in layout.fields}) == 6
    pool.storage[1] = torch.randint(0, 256, (layout.nbytes,), dtype=torch.uint8)
    pool.storage[2] = 0xFF
    before = pool.storage.clone()
    pool.copy_slot(1, 2)
    for field in layout.fields:  # compared as bytes: random bits hold NaNs
        copied, source = (pool.view(field.layer, field.kind)[slot].view(torch.uint8) for slot in (2, 1))
        assert torch.equal(copied, source), f"layer {field.layer} {field.kind}"
    assert torch.equal(pool.storage[2], before[1])
    assert torch.equal(pool.storage[[0, 1, 3]], before[[0, 1, 3]])  # source and the others untouched
    pool.check_integrity()


@pytest.mark.parametrize(
    "src, dst, message",
    [
        (3, 1, r"copy_slot: src slot 3 is not in use"),
        (1, 3, r"dst slot 3"),
        (2, 2, r"src and dst are both slot 2"),
    ],
    ids=["free-source", "free-destination", "same-slot"],
)
def test_copy_slot_refuses_free_or_equal_slots(pool, src, dst, message):
    with pytest.raises(RuntimeError, match=message):
        pool.copy_slot(src, dst)
