"""Checked byte spans: any byte range of a local region into any byte range of a peer's region.

The row API (``row_plan.py``) moves whole rows of same-named regions; a byte span moves
``nbytes`` from ``local_region`` at ``local_offset`` to ``remote_region`` at ``remote_offset``, so a
sender can pack a request's scattered slices into one staging region and write pieces of it into the
receiver's pools (the parallel handoff: ``services/engine/parallel/rank_handoff.py``)::

    local "staging"  [ a a a | b b | c c c c ]          peer "blocks"  [ . a a a . . c c c c . ]
                       0       3     5                                    1          6
    spans  (staging, 0 -> blocks, 1, 3 B)  (staging, 5 -> blocks, 6, 4 B)  (staging, 3 -> state, ...)

Every check happens here, before any backend moves a byte.
"""

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from common.errors import TransferError

from .endpoint import RegionInfo, TransferEndpoint


@dataclass(frozen=True)
class ByteSpan:
    """``nbytes`` from local ``local_region`` at ``local_offset`` to the peer's ``remote_region`` at
    ``remote_offset`` (offsets in bytes from the region's first row)."""

    local_region: str
    local_offset: int
    remote_region: str
    remote_offset: int
    nbytes: int


def check_byte_spans(
    local_regions: Mapping[str, RegionInfo], remote: TransferEndpoint, spans: Sequence[ByteSpan]
) -> list[ByteSpan]:
    """Validate ``spans`` against both sides' registered memory.

    Returns:
        the spans with empty ones dropped, in the given order.

    Raises:
        TransferError: a region unknown on either side, an offset or size that is not a non-negative
            integer, a range outside either side's region, or two spans writing overlapping bytes of
            one remote region.
    """
    checked: list[ByteSpan] = []
    for span in spans:
        local = local_regions.get(span.local_region)
        if local is None:
            raise TransferError(
                f"no local region {span.local_region!r} (registered: {sorted(local_regions)})"
            )
        target = remote.region(span.remote_region)
        try:
            numbers = [operator.index(n) for n in (span.local_offset, span.remote_offset, span.nbytes)]
        except TypeError:
            raise TransferError(f"byte span {span!r}: offsets and size must be integers") from None
        local_offset, remote_offset, nbytes = numbers
        if min(numbers) < 0:
            raise TransferError(f"byte span {span!r}: offsets and size must be >= 0")
        if local_offset + nbytes > local.nbytes:
            raise TransferError(
                f"region {span.local_region!r}: local bytes {local_offset}..{local_offset + nbytes} pass "
                f"its end ({local.nbytes} B)"
            )
        if remote_offset + nbytes > target.nbytes:
            raise TransferError(
                f"region {span.remote_region!r}: remote bytes {remote_offset}..{remote_offset + nbytes} pass "
                f"its end ({target.nbytes} B) on peer {remote.agent_name!r}"
            )
        if nbytes:
            checked.append(
                ByteSpan(span.local_region, local_offset, span.remote_region, remote_offset, nbytes)
            )
    _check_disjoint(checked)
    return checked


def _check_disjoint(spans: list[ByteSpan]) -> None:
    """No two spans write the same byte of one remote region."""
    by_region: dict[str, list[tuple[int, int]]] = {}
    for span in spans:
        by_region.setdefault(span.remote_region, []).append((span.remote_offset, span.nbytes))
    for region, ranges in by_region.items():
        ranges.sort()
        for (start, size), (next_start, _) in zip(ranges, ranges[1:], strict=False):
            if start + size > next_start:
                raise TransferError(
                    f"region {region!r}: remote bytes {next_start}.. are written twice "
                    f"(spans at {start} of {size} B and at {next_start} overlap)"
                )
