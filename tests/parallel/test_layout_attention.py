"""The one-device layout benchmark's rank work (``services.engine.benchmark.layout_attention``) on CPU:
the group's merged selection is the single-rank top-k (checked inside ``measure``), and the bytes a
rank would send are what ``distributed_topk`` and ``DcpAttention`` send."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: the kernels run on CPU

import pytest

from services.engine.benchmark.attention_kernels import AttentionShapes
from services.engine.benchmark.layout_attention import main, measure
from services.engine.parallel.distributed_topk import default_candidates

SHAPES = AttentionShapes(
    heads=4, kv_lora_rank=32, rope_dim=8, nope_dim=16, index_heads=4, index_dim=16, topk=16, block_size=16
)


def _calls(work) -> float:
    work()
    return 1.0


@pytest.mark.parametrize(("tp", "dcp"), [(1, 1), (2, 1), (1, 2), (2, 2), (1, 4)])
def test_rank_work_and_its_exchange(tp, dcp):
    context, batch = 100, 3
    row = measure(SHAPES, "bf16", tp, dcp, context, batch, "cpu", timer=_calls)
    heads = SHAPES.heads // tp
    local = -(-context // dcp)
    assert row.kv_bytes_per_rank == batch * local * (32 + 8 + 16) * 2
    if dcp == 1:
        assert (row.topk_us, row.merge_us, row.sent_bytes, row.candidates) == (1.0, 0.0, 0, SHAPES.topk)
        return
    sent = default_candidates(SHAPES.topk, dcp)
    assert row.candidates == sent
    # a rank's best c (and, for comparison, best k), the merge and refill test; the kernel and the loop
    assert (row.topk_us, row.best_k_topk_us, row.merge_us, row.loop_merge_us) == (2.0, 2.0, 1.0, 1.0)
    round_two = row.refilled_rows * (2 * SHAPES.topk + 1) * 4
    assert row.sent_bytes == batch * (2 * sent + 1) * 4 + round_two + batch * heads * (32 * 2 + 4)


def test_a_layout_that_does_not_divide_the_heads_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--layouts", "1x1,3x1"])
    assert "--layouts: tp 3 does not divide the model's 32 attention heads" in capsys.readouterr().err


def test_a_malformed_layout_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--layouts", "8"])
    assert "--layouts: expected TPxDCP items like 8x1,1x8, got '8'" in capsys.readouterr().err
