"""Host tier -> device load bandwidth per block size, against one plain copy of the same bytes.

Issue 16's goal: loading a prefix from the host tier runs at >= 0.8x a plain pinned host -> device
copy. For each block size (tokens per block), the packed block's bytes come from the model's layout
(``block_layout``: every MLA layer's latent, rope key and index key); ``blocks`` pages of an in-process
``HostTier`` (pinned when CUDA is there), at scattered page numbers, are loaded into as many scattered
blocks of a device ``BlockPool``. Timed, each the median of ``repeats`` after a warm-up:

- ``rows``: ``LocalRows.read`` alone (the connector's copy: a gather on the host, one copy to the
  device, a scatter into the pool);
- ``get``: the connector's whole load of those pages: ``begin_get`` (which verifies every page's
  checksum), ``LocalRows.read``, ``end_get``;
- ``copy``: one ``Tensor.copy_`` of a pinned host tensor of the same bytes into a device tensor.

On a machine without CUDA, ``device`` is ``cpu`` and every number is host -> host (reported as such).
"""

import os
import statistics
import time
from dataclasses import asdict, dataclass

import torch

from services.engine.cache.block_pool import BlockPool
from services.engine.cache.layout import Layout, block_layout
from services.engine.cache.state_pool import StateSlotPool
from services.engine.host_rows import LocalRows
from services.hicache.host_tier import KV, HostTier


@dataclass(frozen=True)
class BandwidthRow:
    """One block size: bytes moved and GB/s (1e9 bytes per second) of each path."""

    block_tokens: int
    block_bytes: int
    blocks: int
    rows_gbps: float
    get_gbps: float
    copy_gbps: float

    @property
    def rows_vs_copy(self) -> float:
        return self.rows_gbps / self.copy_gbps

    @property
    def get_vs_copy(self) -> float:
        return self.get_gbps / self.copy_gbps

    def as_dict(self) -> dict:
        return asdict(self) | {"rows_vs_copy": self.rows_vs_copy, "get_vs_copy": self.get_vs_copy}


def measure_load_bandwidth(
    config, dtype: torch.dtype, device: str, block_sizes: list[int], blocks: int, repeats: int = 5
) -> list[BandwidthRow]:
    """One ``BandwidthRow`` per block size in ``block_sizes`` (see the module).

    Raises:
        ValueError: ``blocks`` or ``repeats`` below 1, naming the flag.
    """
    if blocks < 1:
        raise ValueError(f"--blocks: must be >= 1, got {blocks}")
    if repeats < 1:
        raise ValueError(f"--repeats: must be >= 1, got {repeats}")
    return [_measure(config, dtype, device, size, blocks, repeats) for size in block_sizes]


def _measure(config, dtype, device: str, block_tokens: int, blocks: int, repeats: int) -> BandwidthRow:
    layout = block_layout(config, block_tokens, dtype)
    pool = BlockPool(layout, block_tokens, 2 * blocks, device)
    slots = StateSlotPool(Layout((), 0), 1, device)  # KV blocks only: no state slot to load
    tier = HostTier(layout.nbytes, 0, 2 * blocks * layout.nbytes, 0, "bandwidth")
    rows = LocalRows(tier, pool, slots)
    generator = torch.Generator().manual_seed(0)
    hashes = [os.urandom(32) for _ in range(blocks)]
    put = tier.reserve_put(KV, hashes)
    tier.kv.storage[list(put.pages)] = torch.randint(0, 256, (blocks, layout.nbytes), dtype=torch.uint8)
    tier.commit_put(put.lease_id)
    block_ids = torch.randperm(2 * blocks, generator=generator)[:blocks].tolist()
    pages = list(put.pages)

    def load_rows() -> None:
        rows.read(pages, block_ids, None, 0)

    def load_get() -> None:
        lease = tier.begin_get(KV, hashes)
        rows.read(list(lease.pages), block_ids, None, 0)
        tier.end_get(lease.lease_id)

    source = torch.empty(blocks * layout.nbytes, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
    target = torch.empty_like(source, device=device)

    def plain_copy() -> None:
        target.copy_(source, non_blocking=True)

    nbytes = blocks * layout.nbytes
    if not torch.equal(_after(load_rows, pool, block_ids), tier.kv.storage[pages]):
        raise RuntimeError("LocalRows.read did not move the pages' bytes into the blocks")
    return BandwidthRow(
        block_tokens,
        layout.nbytes,
        blocks,
        nbytes / _median_s(load_rows, device, repeats) / 1e9,
        nbytes / _median_s(load_get, device, repeats) / 1e9,
        nbytes / _median_s(plain_copy, device, repeats) / 1e9,
    )


def _after(load, pool: BlockPool, block_ids: list[int]) -> torch.Tensor:
    load()
    return pool.storage[block_ids].cpu()


def _median_s(function, device: str, repeats: int) -> float:
    synchronize = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    function()  # warm-up
    synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def format_rows(rows: list[BandwidthRow], device: str) -> str:
    """The rows as a fixed-width table."""
    where = "host -> host (no CUDA here)" if device == "cpu" else f"pinned host -> {device}"
    lines = [
        f"host tier load bandwidth, {where}; GB/s, median; rows = LocalRows.read, get = begin_get "
        "(checksums) + read + end_get, copy = one Tensor.copy_ of the same bytes (goal: >= 0.8x copy)",
        f"{'block':>6}{'block bytes':>13}{'blocks':>8}{'rows':>9}{'get':>9}{'copy':>9}{'rows/copy':>11}"
        f"{'get/copy':>10}",
    ]
    for r in rows:
        lines.append(
            f"{r.block_tokens:>6}{r.block_bytes:>13,}{r.blocks:>8}{r.rows_gbps:>9.2f}{r.get_gbps:>9.2f}"
            f"{r.copy_gbps:>9.2f}{r.rows_vs_copy:>11.2f}{r.get_vs_copy:>10.2f}"
        )
    return "\n".join(lines)
