"""Turning ``(local_row, remote_row)`` pairs into checked, coalesced byte spans.

Pairs that are consecutive on both sides become one span (one descriptor per run of rows)::

    pairs  (3,17) (4,18) (5,19) (9,2)        spans  local 3..5 -> remote 17..19  (count 3)
                                                    local 9    -> remote 2      (count 1)

Every check happens here, before any backend moves a byte.
"""

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from common.errors import TransferError

from .endpoint import RegionInfo, TransferEndpoint


@dataclass(frozen=True)
class RowSpan:
    """``count`` consecutive rows of ``region``: local ``local_row..`` -> remote ``remote_row..``."""

    region: str
    local_row: int
    remote_row: int
    count: int


def plan_row_copies(
    local_regions: Mapping[str, RegionInfo],
    remote: TransferEndpoint,
    copies: Mapping[str, Sequence[tuple[int, int]]],
    reading: bool = False,
) -> list[RowSpan]:
    """Validate ``copies`` (region -> ``(local_row, remote_row)`` pairs) and coalesce them.

    ``reading``: the rows move from the peer into local rows (``TransferBackend.read``), so a local
    row may be named only once and a remote row any number of times; writing, the other way round.

    Returns:
        spans grouped by region in ``copies`` order, each region's spans sorted by remote row.

    Raises:
        TransferError: a region unknown on either side, row sizes that differ, a row that is not an
            integer or is out of range on either side, or a destination row named twice.
    """
    spans: list[RowSpan] = []
    for region, pairs in copies.items():
        local = local_regions.get(region)
        if local is None:
            raise TransferError(f"no local region {region!r} (registered: {sorted(local_regions)})")
        target = remote.region(region)
        if local.row_bytes != target.row_bytes:
            raise TransferError(
                f"region {region!r}: local rows are {local.row_bytes} B but peer "
                f"{remote.agent_name!r} rows are {target.row_bytes} B"
            )
        checked: list[tuple[int, int]] = []
        seen_destinations: set[int] = set()
        for pair in pairs:
            try:
                src, dst = (operator.index(row) for row in pair)
            except (TypeError, ValueError):
                raise TransferError(f"region {region!r}: row pair {pair!r} is not two integers") from None
            if not 0 <= src < local.num_rows:
                raise TransferError(f"region {region!r}: local row {src} out of range [0, {local.num_rows})")
            if not 0 <= dst < target.num_rows:
                raise TransferError(
                    f"region {region!r}: remote row {dst} out of range [0, {target.num_rows}) "
                    f"on peer {remote.agent_name!r}"
                )
            destination, side = (src, "local") if reading else (dst, "remote")
            if destination in seen_destinations:
                raise TransferError(f"region {region!r}: {side} row {destination} is written twice")
            seen_destinations.add(destination)
            checked.append((src, dst))
        spans.extend(_coalesce(region, checked))
    return spans


def _coalesce(region: str, pairs: list[tuple[int, int]]) -> list[RowSpan]:
    """Merge pairs consecutive on both sides into spans (input: unique rows on the written side)."""
    runs: list[list[int]] = []  # [local_row, remote_row, count]
    for src, dst in sorted(pairs, key=lambda pair: pair[1]):
        if runs and runs[-1][0] + runs[-1][2] == src and runs[-1][1] + runs[-1][2] == dst:
            runs[-1][2] += 1
        else:
            runs.append([src, dst, 1])
    return [RowSpan(region, src, dst, count) for src, dst, count in runs]
