"""The handoff checksum: a keyed hash of the rows a handoff writes, computed by the prefill worker over
the rows it sends and by the decode worker over the rows they landed in, before it decodes.

Each region's rows (``REGIONS`` order, rows in the handoff's order) are read as 32-bit words numbered
on across regions and hashed by ``kernels/checksum`` (``sum_i x_i * w_i mod 2^64``, 32-bit weights
from a splitmix64 stream of the word index and the key), the key taken from the reservation's one-time
capability (``CacheReservation.capability``). For a writer that does not know the capability, any
change to the rows passes with probability at most ``2^-32`` (``kernels/checksum/naive.py`` says why),
and each reservation has its own key. Integer arithmetic only, so the prefill worker's GPU and the decode
worker's CPU (or GPU) agree; on CUDA one Triton launch per region reads each byte once and the handoff
syncs once, on the CPU the torch reference runs.

A parallel handoff (``parallel/rank_handoff.py``: each prefill rank writes byte spans into several
decode ranks) is hashed by where its bytes land instead (``spans_checksum``): the byte at offset ``o`` of
region ``r`` on decode rank ``d`` weighs as address ``span_address(d, r, o)``. Each prefill rank hashes
the spans it writes, each decode rank the spans it owns (``handoff_plan.landing_spans``), and both sums
add up to one value whatever the two groups' layouts.
"""

import torch

from kernels.checksum import naive
from services.transfer import BLOCKS, DRAFT_BLOCKS, DRAFT_STATE, STATE

REGIONS = (BLOCKS, STATE, DRAFT_BLOCKS, DRAFT_STATE)  # the order the regions are hashed in
_REGION_BITS = 42  # a region's span addresses: 4 TiB of offsets


def checksum_key(capability: str) -> int:
    """The 64-bit key of a capability (hex; its first 16 digits)."""
    return int(capability[:16] or "0", 16)


def rows_checksum(
    storages: dict[str, torch.Tensor], rows: dict[str, list[int]], capability: str, start_word: int = 0
) -> int:
    """The checksum of a handoff's rows: ``rows[region]`` of ``storages[region]`` (a pool's
    ``[num_rows, row_bytes]`` uint8 storage), regions in ``REGIONS`` order, under the capability's key,
    the words numbered from ``start_word`` (a part of a handoff: where its words start in the whole).
    On CUDA: one copy of the row ids to the device, a launch per region, one sync.

    Raises:
        KeyError: rows of a region without storage.
    """
    key = checksum_key(capability)
    regions = [region for region in REGIONS if rows.get(region)]
    if not regions:
        return 0
    device = storages[regions[0]].device
    ids = torch.tensor([i for region in regions for i in rows[region]], dtype=torch.int64)
    ids = ids.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else ids
    sums, start, first = [], start_word, 0
    for region in regions:
        storage, count = storages[region], len(rows[region])
        index = ids[first : first + count]
        if device.type == "cuda":
            from kernels.checksum import keyed_triton  # Triton only where there is a GPU

            sums.append(keyed_triton.keyed_rows_partials(storage, index, start, key))
        else:
            sums.append(naive.keyed_rows_checksum(storage, index, start, key))
        start += count * (storage.shape[1] // 4)
        first += count
    total = int(torch.cat(sums).sum()) if device.type == "cuda" else sum(sums)
    return total % (1 << 64)


def span_address(decode_rank: int, region: str, offsets: torch.Tensor) -> torch.Tensor:
    """The checksum address of ``offsets`` (int64) into ``region`` of ``decode_rank``: every byte of
    every decode rank's regions has its own."""
    return offsets + ((decode_rank * len(REGIONS) + REGIONS.index(region)) << _REGION_BITS)


def spans_checksum(
    source: torch.Tensor, offsets: torch.Tensor, addresses: torch.Tensor, nbytes: torch.Tensor, key: int
) -> torch.Tensor:
    """The checksum of byte spans of the flat uint8 ``source`` placed at ``addresses``
    (``kernels/checksum``'s ``keyed_spans_checksum``), as int64 partial sums whose sum mod ``2^64`` is
    the value: on CUDA left on the device (one Triton launch, no sync: see ``settled``), on the CPU one
    value from the torch reference."""
    if source.is_cuda:
        from kernels.checksum import keyed_triton  # Triton only where there is a GPU

        return keyed_triton.keyed_spans_partials(source, offsets, addresses, nbytes, key)
    value = naive.keyed_spans_checksum(source, offsets, addresses, nbytes, key)
    return torch.tensor([naive.as_int64(value)], dtype=torch.int64)


def settled(partials: list[torch.Tensor]) -> int:
    """The checksum that partial sums (``spans_checksum``'s, from any devices) add up to."""
    return sum(int(part.sum()) for part in partials) % (1 << 64)
