"""The handoff checksum: a keyed hash of the rows a handoff writes, computed by the prefill worker over
the rows it sends and by the decode worker over the rows they landed in, before it decodes.

Each region's rows (``REGIONS`` order, rows in the handoff's order) are read as 32-bit words numbered
on across regions and hashed by ``kernels/checksum`` (``sum_i x_i * w_i mod 2^64``, the weights a
splitmix64 stream of the word index and the key), the key taken from the reservation's one-time
capability (``CacheReservation.capability``). For a writer that does not know the capability, any
change to the rows passes with probability about ``2^-32`` (the weights are unknown; a difference of
2-adic valuation ``v < 32`` in one word must cancel mod ``2^(64 - v)``), and each reservation has its
own key. Integer arithmetic only, so the prefill worker's GPU and the decode worker's CPU (or GPU)
agree; on CUDA one Triton launch per region reads each byte once, on the CPU the torch reference runs.
"""

import torch

from kernels.checksum import naive
from services.transfer import BLOCKS, DRAFT_BLOCKS, DRAFT_STATE, STATE

REGIONS = (BLOCKS, STATE, DRAFT_BLOCKS, DRAFT_STATE)  # the order the regions are hashed in


def checksum_key(capability: str) -> int:
    """The 64-bit key of a capability (hex; its first 16 digits)."""
    return int(capability[:16] or "0", 16)


def rows_checksum(storages: dict[str, torch.Tensor], rows: dict[str, list[int]], capability: str) -> int:
    """The checksum of a handoff's rows: ``rows[region]`` of ``storages[region]`` (a pool's
    ``[num_rows, row_bytes]`` uint8 storage), regions in ``REGIONS`` order, under the capability's key.

    Raises:
        KeyError: rows of a region without storage.
    """
    total, start, key = 0, 0, checksum_key(capability)
    for region in REGIONS:
        ids = rows.get(region)
        if not ids:
            continue
        storage = storages[region]
        index = torch.tensor(ids, dtype=torch.int64, device=storage.device)
        total += _kernel(storage)(storage, index, start, key)
        start += len(ids) * (storage.shape[1] // 4)
    return total % (1 << 64)


def _kernel(storage: torch.Tensor):
    if storage.device.type == "cuda":
        from kernels.checksum import keyed_triton

        return keyed_triton.keyed_rows_checksum
    return naive.keyed_rows_checksum
