"""The step contract: every field of ``StepMetadata`` for a ragged step, one device buffer behind
them all, static refills for CUDA graphs, and clear errors on malformed steps."""

import pytest
import torch

from services.engine.model import SequenceStep, build_step_metadata

BLOCK = 4
STEPS = [
    SequenceStep(
        token_ids=(11, 12, 13, 14, 15), past=3, block_table=(7, 2, 9), slot=4
    ),  # chunk after a prefix
    SequenceStep(token_ids=(21,), past=6, block_table=(5, 1), slot=0),  # decode
    SequenceStep(token_ids=(31, 32, 33), past=0, block_table=(3,), slot=2),  # fresh prefill
]


def test_every_field_of_a_ragged_step():
    meta = build_step_metadata(STEPS, BLOCK, "cpu", index_topk=16)
    assert meta.input_ids.tolist() == [11, 12, 13, 14, 15, 21, 31, 32, 33]
    assert meta.positions.tolist() == [3, 4, 5, 6, 7, 6, 0, 1, 2]
    assert meta.query_start_loc.tolist() == [0, 5, 6, 9]
    assert meta.query_seq.tolist() == [0, 0, 0, 0, 0, 1, 2, 2, 2]
    # position p of a sequence goes to block_table[p // 4] * 4 + p % 4
    assert meta.slot_mapping.tolist() == [
        7 * 4 + 3,
        2 * 4,
        2 * 4 + 1,
        2 * 4 + 2,
        2 * 4 + 3,
        1 * 4 + 2,
        12,
        13,
        14,
    ]
    assert meta.seq_lens.tolist() == [8, 7, 3] and meta.past_lens.tolist() == [3, 6, 0]
    assert meta.block_tables.tolist() == [[7, 2], [5, 1], [3, 0]]  # as many blocks as needed, 0-padded
    assert meta.kda_slots.tolist() == [4, 0, 2] and meta.has_state.tolist() == [True, True, False]
    assert meta.logit_rows.tolist() == [4, 5, 8]
    assert (meta.max_query_len, meta.max_seq_len, meta.num_decode_tokens) == (5, 8, 1)
    assert (meta.num_tokens, meta.num_seqs, meta.index_topk, meta.is_pure_decode) == (9, 3, 16, False)
    assert meta.block_tables_host == ((7, 2), (5, 1), (3,)) and meta.rows(1) == slice(5, 6)
    dtypes = {name: getattr(meta, name).dtype for name in ("input_ids", "slot_mapping", "logit_rows")}
    assert set(dtypes.values()) == {torch.int64}
    for name in (
        "positions",
        "query_start_loc",
        "seq_lens",
        "past_lens",
        "query_seq",
        "block_tables",
        "kda_slots",
    ):
        assert getattr(meta, name).dtype == torch.int32, name
    assert meta.has_state.dtype == torch.bool


def test_all_fields_view_one_buffer_and_a_refill_updates_them_in_place():
    """One host-to-device copy per step; a CUDA graph's static buffer is refilled through ``packed``."""
    first = build_step_metadata([STEPS[1], STEPS[0]], BLOCK, "cpu", max_blocks=3, max_seq_len=64)
    storage = first.packed.untyped_storage().data_ptr()
    for name in ("input_ids", "positions", "slot_mapping", "block_tables", "has_state", "query_start_loc"):
        assert getattr(first, name).untyped_storage().data_ptr() == storage, name
    steps = [SequenceStep((99,), 6, (5, 1), 1), SequenceStep((1, 2, 3, 4, 5), 3, (8, 6), 3)]
    second = build_step_metadata(steps, BLOCK, "cpu", max_blocks=3, max_seq_len=64, out=first.packed)
    assert second.packed is first.packed and first.max_seq_len == 64
    assert first.input_ids.tolist() == [99, 1, 2, 3, 4, 5] and first.kda_slots.tolist() == [1, 3]
    assert first.block_tables.tolist() == [[5, 1, 0], [8, 6, 0]]


@pytest.mark.parametrize(
    "steps, kwargs, message",
    [
        ([], {}, "steps: a step needs at least one sequence"),
        (
            [SequenceStep((), 0, (1,), 0)],
            {},
            r"steps\[0\]: every sequence in a step needs at least one new token",
        ),
        ([SequenceStep((1, 2), 3, (1,), 0)], {}, r"steps\[0\]: block table holds 1 blocks, 5 tokens need 2"),
        ([STEPS[0]], {"max_blocks": 1}, "max_blocks: 1 is narrower than the widest block table"),
        ([STEPS[1]], {"out": torch.empty(3, dtype=torch.uint8)}, "out: expected"),
    ],
    ids=["no-sequence", "no-token", "short-table", "narrow-tables", "wrong-buffer"],
)
def test_malformed_steps_are_refused(steps, kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_step_metadata(steps, BLOCK, "cpu", **kwargs)
