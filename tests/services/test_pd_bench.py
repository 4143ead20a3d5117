"""``baton bench pd``: the workload is deterministic, a tiny run's report is complete and plausible
(long prefills handed off only when disaggregated), and bad flags are one-line CLI errors."""

import json
import math

import pytest

from cli.main import main
from deploy.benchmark import PDWorkload, measure_pd
from deploy.benchmark.pd_workload import DECODE_PROMPT_TOKENS, LOCAL_PREFILL_TOKENS

WORKLOAD = PDWorkload(decode_streams=2, decode_tokens=6, rounds=2, prefill_len=160, prefills=2, seed=3)


@pytest.fixture(scope="module")
def report(tiny_checkpoint):
    # grpc_bytes: NIXL's progress thread would keep a core busy in every worker of a 2-core runner.
    return measure_pd(str(tiny_checkpoint("k3")), WORKLOAD, transfer_backend="grpc_bytes")


def test_workload_is_deterministic_and_prefills_share_no_prefix():
    decode, prefill, warmup = WORKLOAD.prompts(vocab_size=1024, warmups=2)
    assert (decode, prefill, warmup) == WORKLOAD.prompts(vocab_size=1024, warmups=2)
    other = PDWorkload(**{**WORKLOAD.__dict__, "seed": 4}).prompts(vocab_size=1024, warmups=2)
    assert other[1] != prefill
    assert [len(stream) for stream in decode] == [WORKLOAD.rounds] * WORKLOAD.decode_streams
    lengths = [len(prompt) for stream in decode for prompt in stream]
    assert DECODE_PROMPT_TOKENS[0] <= min(lengths) and max(lengths) <= LOCAL_PREFILL_TOKENS
    longs = prefill + warmup[2:]
    assert all(len(prompt) == WORKLOAD.prefill_len for prompt in longs)
    assert len({tuple(prompt[:16]) for prompt in longs}) == len(longs)  # no shared first block
    assert all(3 <= token < 1024 for prompt in longs for token in prompt)


def test_report_counts_match_the_workload(report):
    assert (report.colocated.disaggregation, report.colocated.prefill_workers) == ("never", 0)
    assert report.colocated.decode_workers == 2  # as many worker processes as disaggregated
    assert (report.disaggregated.disaggregation, report.disaggregated.prefill_workers) == ("conditional", 1)
    assert report.disaggregated.decode_workers == 1
    for mode in (report.colocated, report.disaggregated):
        summary = mode.summary()
        assert summary["decodes_completed"] == WORKLOAD.decode_requests == 4
        assert summary["prefills_completed"] == WORKLOAD.prefills
        decodes, prefills = mode.of_kind("decode"), mode.of_kind("prefill")
        assert all(r.completion_tokens == WORKLOAD.decode_tokens for r in decodes)
        assert all(r.prompt_tokens <= LOCAL_PREFILL_TOKENS for r in decodes)
        assert all(r.prompt_tokens == WORKLOAD.prefill_len and r.completion_tokens == 2 for r in prefills)
        assert all(r.decode_worker.startswith("decode-") for r in mode.records)


def test_latencies_are_positive_and_ordered(report):
    for mode in (report.colocated, report.disaggregated):
        s = mode.summary()
        for key, value in s.items():
            assert math.isfinite(value) and value >= 0, key
        assert 0 < s["tpot_p50_ms"] <= s["tpot_p99_ms"]
        assert 0 < s["itl_p50_ms"] <= s["itl_p99_ms"] <= s["itl_max_ms"]
        assert 0 < s["ttft_p50_ms"] and 0 < s["prefill_ttft_p50_ms"]
        assert 0 < s["wall_s"] and 0 < s["decode_time_with_prefill_in_flight"] <= 1
        for record in mode.records:
            assert record.sent < record.arrivals[0] <= record.arrivals[-1]
        for record in mode.of_kind("decode"):
            assert record.tpot * (record.completion_tokens - 1) == pytest.approx(record.e2e - record.ttft)
    ratios = report.ratios()
    assert set(ratios) == {"tpot_p50", "tpot_p99", "itl_p99"}
    assert all(math.isfinite(value) and value > 0 for value in ratios.values())


def test_only_disaggregated_long_prefills_go_through_a_prefill_worker(report):
    for record in report.colocated.records:
        assert record.prefill_worker == "" and record.transfer_bytes == 0 and not record.handed_off
    disaggregated = report.disaggregated
    # Conditional: the short decode prompts prefill on the decode worker, the long ones hand off.
    assert not any(record.handed_off for record in disaggregated.of_kind("decode"))
    assert all(record.handed_off for record in disaggregated.of_kind("prefill"))
    assert disaggregated.summary()["prefills_handed_off"] == WORKLOAD.prefills
    assert report.colocated.summary()["prefills_handed_off"] == 0


def test_table_and_json_name_the_setup(report):
    table = report.format_table()
    assert "conditional" in table and "grpc_bytes" in table
    rows = [line.split()[0] for line in table.splitlines()]
    assert "colocated" in rows and "disaggregated" in rows
    assert "disaggregated / colocated: TPOT p50" in table
    data = json.loads(json.dumps(report.as_dict()))
    assert set(data["modes"]) == {"colocated", "disaggregated"}
    assert data["modes"]["disaggregated"]["disaggregation"] == "conditional"
    assert data["ratios_disaggregated_over_colocated"] == pytest.approx(report.ratios())


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--decode-streams", "0"], "--decode-streams: must be >= 1"),
        (["--decode-tokens", "1"], "--decode-tokens: must be >= 2"),
        (["--rounds", "0"], "--rounds: must be >= 1"),
        (["--prefills", "-1"], "--prefills: must be >= 1"),
        (["--prefill-len", "16"], "--prefill-len: must be in 17..4094"),
        (["--prefill-len", "5000"], "--prefill-len: must be in 17..4094"),
        (["--prefill-workers", "0"], "--prefill-workers: must be >= 1"),
        (["--decode-workers", "0"], "--decode-workers: must be >= 1"),
        (["--transfer-backend", "pigeon"], "--transfer-backend: expected one of"),
        (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens: must be >= 1"),
    ],
    ids=lambda value: "_".join(value) if isinstance(value, list) else "",
)
def test_bad_flags_are_cli_errors(flags, message, capsys):
    assert main(["bench", "pd", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("baton bench: error: ") and message in err and "Traceback" not in err


def test_colocated_is_not_a_disaggregation_choice(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "pd", "--disaggregation", "never"])
    assert exit_info.value.code == 2 and "--disaggregation" in capsys.readouterr().err
