"""Rank 0's view of a handoff, without ranks: a group's ``HandoffSide`` from the layout its reservation
carries, the decode layouts no prefill group can write into (refused at Reserve, naming the flag), and
``check_sender``: the pair check a prefill worker makes at Prefill and a decode worker at Reserve."""

from dataclasses import replace

import pytest
import torch

from services.engine.checkpoint.presets import preset_config
from services.engine.handoff import HandoffLayout
from services.engine.model.config_loader import load_model_config
from services.engine.parallel.group_handoff import check_sender, handoff_side, not_a_target
from services.engine.parallel.handoff_plan import HandoffSide
from services.engine.parallel.layout import ParallelLayout

CONFIG = load_model_config(preset_config("k3", "tiny"))


def layout(parallel: ParallelLayout, numerics: str = "default") -> HandoffLayout:
    return HandoffLayout(8, "bfloat16", "fp8", "blocks", "slots", numerics, "model", parallel)


def test_a_side_is_what_the_layout_says():
    side = handoff_side(layout(ParallelLayout(tp=2, dcp=2), "batch_invariant"))
    assert side == HandoffSide(ParallelLayout(tp=2, dcp=2), 8, torch.bfloat16, "fp8", 16)
    assert handoff_side(layout(ParallelLayout())).open_chunk_rows == 0


@pytest.mark.parametrize(
    "parallel, refusal",
    [
        (ParallelLayout(), None),
        (ParallelLayout(tp=2, dcp=2), None),
        (ParallelLayout(pcp=2), "decode --pcp 2: a handoff target is a tp x dcp group"),
        (ParallelLayout(pp=2, tp=2), "decode --pp 2: a handoff target is a tp x dcp group"),
    ],
    ids=["one-rank", "tp2-dcp2", "pcp2", "pp2"],
)
def test_decode_layouts_no_prefill_group_can_write_into(parallel, refusal):
    said = not_a_target(CONFIG, layout(parallel))
    assert said == refusal if refusal is None else said.startswith(refusal), said


@pytest.mark.parametrize(
    "prefill, decode, refusal",
    [
        (layout(ParallelLayout()), layout(ParallelLayout()), None),
        (layout(ParallelLayout(tp=2)), replace(layout(ParallelLayout(dcp=2)), block_size=4), None),
        (
            replace(layout(ParallelLayout()), block_size=4),
            layout(ParallelLayout()),
            "reservation.layout.block_size",
        ),
        (
            layout(ParallelLayout(tp=2), "batch_invariant"),
            layout(ParallelLayout()),
            "reservation.layout.numerics",
        ),
        (layout(ParallelLayout(tp=2)), layout(ParallelLayout(tp=3)), "decode --tp 3"),
        (layout(ParallelLayout()), layout(ParallelLayout(pcp=2)), "decode --pcp 2"),
    ],
    ids=["equal", "tp2-into-dcp2", "rows-block-size", "numerics", "tp-not-dividing-heads", "decode-pcp"],
)
def test_check_sender_is_the_pair_check_of_both_sides(prefill, decode, refusal):
    if refusal is None:
        check_sender(CONFIG, prefill, decode)
        return
    with pytest.raises(ValueError, match=refusal):
        check_sender(CONFIG, prefill, decode)
