"""``baton bench engine``'s report of where a decode step's time goes: the kernels' device time beside
the step's (``gpu ms``) and, with ``--top-kernels``, each row's busiest kernels with their calls,
device time and share of the step, in the JSON too; the flag's bad value named. The kernels
themselves are profiled on CUDA only (``count_launches``)."""

import json

from cli.main import main
from services.engine.benchmark.engine_bench import (
    EngineBenchReport,
    EngineBenchRow,
    format_busiest,
    format_table,
)
from services.engine.benchmark.launch_count import KernelTime


def _row(batch: int, busiest: tuple[KernelTime, ...]) -> EngineBenchRow:
    return EngineBenchRow(
        mode="default", kernels="triton", batch=batch, context=32768, prefill_tokens_per_s=1.0,
        decode_tokens_per_s=1.0, decode_step_s=0.010, launches_per_step=2, kernels_per_step=900,
        peer_decode_tokens_per_s=None, kernel_s_per_step=0.0075 if busiest else None, busiest_kernels=busiest,
    )  # fmt: skip


def test_each_row_lists_its_busiest_kernels_with_their_share_of_the_step():
    busiest = (KernelTime("grouped_gemm_kernel", 14, 6000.0), KernelTime("indexer_scores", 2, 1500.0))
    report = EngineBenchReport([_row(64, busiest), _row(1, ())], 1, 1.0, "not run")
    lines = format_busiest(report, top=1).splitlines()
    assert lines == [
        "busiest kernels of a decode step: default triton batch 64 context 32768",
        "     6.000 ms  60.0%    14x  grouped_gemm_kernel",
    ]
    table = format_table(report).splitlines()
    assert "gpu ms" in table[1]
    assert table[3].split()[6:8] == ["10.000", "7.500"] and table[4].split()[6:8] == ["10.000", "n/a"]
    row = report.as_dict()["rows"][0]
    assert row["busiest_kernels"][1] == {"name": "indexer_scores", "calls": 2, "total_us": 1500.0}
    assert json.dumps(report.as_dict())  # the tuple of kernel times is plain JSON


def test_a_negative_count_is_refused(capsys):
    assert main(["bench", "engine", "--top-kernels", "-1"]) == 2
    assert "baton bench: error: --top-kernels: must be >= 0, got -1" in capsys.readouterr().err
