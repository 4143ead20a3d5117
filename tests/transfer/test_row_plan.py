"""Row-pair validation and coalescing (no processes, no NIXL)."""

import pytest

from common.errors import TransferError
from services.transfer import BLOCKS, STATE, RegionInfo, TransferEndpoint
from services.transfer.row_plan import RowSpan, plan_row_copies

LOCAL = {
    BLOCKS: RegionInfo(BLOCKS, 1000, 64, 8, "DRAM", 0),
    STATE: RegionInfo(STATE, 9000, 256, 2, "DRAM", 0),
}
REMOTE = TransferEndpoint(
    "nixl",
    "decode-0",
    b"",
    (RegionInfo(BLOCKS, 50000, 64, 10, "DRAM", 0), RegionInfo(STATE, 90000, 256, 4, "DRAM", 0)),
)


@pytest.mark.parametrize(
    "pairs, spans",
    [
        ([(3, 7)], [(3, 7, 1)]),
        ([(0, 4), (1, 5), (2, 6)], [(0, 4, 3)]),
        ([(2, 6), (0, 4), (1, 5)], [(0, 4, 3)]),  # order of pairs does not matter
        ([(0, 4), (1, 5), (5, 6), (6, 7)], [(0, 4, 2), (5, 6, 2)]),  # remote consecutive, local not
        ([(0, 9), (1, 0), (2, 1)], [(1, 0, 2), (0, 9, 1)]),
        ([(4, 1), (4, 2)], [(4, 1, 1), (4, 2, 1)]),  # one local row to two remote rows
        ([], []),
    ],
    ids=["single", "run", "shuffled-run", "two-runs", "wrap", "fan-out", "empty"],
)
def test_coalesces_rows_consecutive_on_both_sides(pairs, spans):
    got = plan_row_copies(LOCAL, REMOTE, {BLOCKS: pairs})
    assert got == [RowSpan(BLOCKS, *span) for span in spans]


def test_regions_keep_the_order_given():
    got = plan_row_copies(LOCAL, REMOTE, {STATE: [(1, 3)], BLOCKS: [(0, 0)]})
    assert got == [RowSpan(STATE, 1, 3, 1), RowSpan(BLOCKS, 0, 0, 1)]


@pytest.mark.parametrize(
    "copies, error",
    [
        ({BLOCKS: [(8, 0)]}, r"local row 8 out of range \[0, 8\)"),
        ({BLOCKS: [(-1, 0)]}, r"local row -1 out of range"),
        ({BLOCKS: [(0, 10)]}, r"remote row 10 out of range \[0, 10\) on peer 'decode-0'"),
        ({STATE: [(0, 4)]}, r"remote row 4 out of range \[0, 4\)"),
        ({BLOCKS: [(0, 3), (1, 3)]}, r"remote row 3 is written twice"),
        ({BLOCKS: [(0.0, 3)]}, r"not two integers"),
        ({BLOCKS: [(0, 1, 2)]}, r"not two integers"),
        ({"draft": [(0, 0)]}, r"no local region 'draft'"),
    ],
    ids=[
        "local-high",
        "local-negative",
        "remote-high",
        "slot-high",
        "duplicate",
        "float",
        "triple",
        "region",
    ],
)
def test_rejects_bad_rows(copies, error):
    with pytest.raises(TransferError, match=error):
        plan_row_copies(LOCAL, REMOTE, copies)


def test_rejects_region_missing_on_peer_and_size_mismatch():
    local = {**LOCAL, "draft": RegionInfo("draft", 0, 64, 2, "DRAM", 0)}
    with pytest.raises(TransferError, match="peer 'decode-0' has no region 'draft'"):
        plan_row_copies(local, REMOTE, {"draft": [(0, 0)]})
    local = {BLOCKS: RegionInfo(BLOCKS, 1000, 128, 8, "DRAM", 0)}
    with pytest.raises(TransferError, match="local rows are 128 B but peer 'decode-0' rows are 64 B"):
        plan_row_copies(local, REMOTE, {BLOCKS: [(0, 0)]})


def test_reading_names_each_local_row_once_and_remote_rows_freely():
    got = plan_row_copies(LOCAL, REMOTE, {BLOCKS: [(0, 4), (1, 5), (2, 5)]}, reading=True)
    assert got == [RowSpan(BLOCKS, 0, 4, 2), RowSpan(BLOCKS, 2, 5, 1)]
    with pytest.raises(TransferError, match="local row 3 is written twice"):
        plan_row_copies(LOCAL, REMOTE, {BLOCKS: [(3, 1), (3, 2)]}, reading=True)
