"""``baton bench trust``: a tiny run's report is complete and its arms differ as they claim (the trusted
router refuses a request without the token, its decode worker hashes every handoff, the open one none),
and bad flags are one-line CLI errors."""

import json

import pytest

from cli.main import main
from deploy.benchmark.trust_cost import ARMS, ROW_BYTES, measure_trust_cost

REQUESTS, WARMUP = 3, 1


@pytest.fixture(scope="module")
def report(tiny_checkpoint):
    return measure_trust_cost(
        str(tiny_checkpoint("k3")),
        requests=REQUESTS,
        warmup=WARMUP,
        prompt_tokens=48,
        sizes_bytes=(ROW_BYTES, 4 * ROW_BYTES),
    )


def test_the_arms_differ_as_they_claim(report):
    assert report.refused_without_token
    assert report.checks == {"open": 0, "trusted": REQUESTS}  # the timed requests' checks
    assert report.check_ms["trusted"] > 0 and report.check_ms["open"] == 0
    # Every timed request was handed off, the same bytes in both arms (same prompt lengths, no hits).
    assert report.handoff_bytes["open"] == report.handoff_bytes["trusted"] > 0
    assert all(len(report.ttft_ms[arm]) == REQUESTS and min(report.ttft_ms[arm]) > 0 for arm in ARMS)


def test_data_plane_rows_and_the_table(report):
    assert [row.size_bytes for row in report.data_plane] == [ROW_BYTES, 4 * ROW_BYTES]
    assert all(
        row.transfer_ms > 0 and row.checksum_ms > 0 and row.last_part_ms > 0 and row.spans_ms > 0
        for row in report.data_plane
    )
    table = report.format_table()
    assert "trusted" in table and "256 KiB" in table and "goal, at most 2%: TTFT" in table
    row = json.loads(json.dumps(report.as_dict()))
    assert row["trusted_checks"] == REQUESTS and row["ttft_ratio_p50"] > 0 and row["check_share_of_ttft"] > 0
    assert "at 450 GB/s" in table  # the cost on a link beside this host's write
    first = report.data_plane[0]
    assert row["data_plane"][0]["cost_at_50_gbps"] == round(first.last_part_ms / (first.size_bytes / 50e6), 4)
    assert [entry["size_bytes"] for entry in row["data_plane"]] == [ROW_BYTES, 4 * ROW_BYTES]
    assert "parallel ms" in table and row["data_plane"][1]["parallel_cost"] == round(
        report.data_plane[1].spans_ms / report.data_plane[1].transfer_ms, 4
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--sizes", "100K"], "--sizes: need multiples of 64K"),
        (["--sizes", "1Q"], "--sizes: expected comma-separated sizes"),
        (["--requests", "0"], "--requests: must be >= 1"),
        (["--warmup", "-1"], "--warmup: must be >= 0"),
        (["--links-gbps", "fast"], "--links-gbps: expected comma-separated GB/s"),
        (["--links-gbps", "0"], "--links-gbps: need positive GB/s"),
    ],
)
def test_bad_flags_are_cli_errors(flags, message, capsys):
    assert main(["bench", "trust", *flags]) == 2
    assert message in capsys.readouterr().err
