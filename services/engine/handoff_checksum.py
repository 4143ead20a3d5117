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
"""

import torch

from kernels.checksum import naive
from services.transfer import BLOCKS, DRAFT_BLOCKS, DRAFT_STATE, STATE

REGIONS = (BLOCKS, STATE, DRAFT_BLOCKS, DRAFT_STATE)  # the order the regions are hashed in


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
