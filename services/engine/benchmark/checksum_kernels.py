"""The handoff checksum's kernel: ``baton bench kernels --ops checksum``.

``kernels.checksum.keyed_triton.keyed_rows_checksum`` over a handoff of 16 / 64 / 256 MiB of packed
K3 blocks (the ``full`` preset's block row, bf16, 64 tokens a block; every row hashed), against the
copy bandwidth and the torch reference (``kernels.checksum.naive``) on the same GPU. Each side of a
handoff hashes its bytes once, so a link of ``L`` GB/s pays ``2 * L / checksum GB/s`` of its transfer
time for the check (the issue's goal: <= 2%).
"""

import torch

from kernels.checksum import keyed_triton, naive
from services.engine.cache.layout import block_layout

from .kernel_bench import KernelBenchContext, KernelResult
from .timing import device_us

HANDOFF_MIB = (16, 64, 256)
BLOCK_TOKENS = 64
KEY = 0x9F1C0B7E5A3D2C1B


def bench_checksum(context: KernelBenchContext) -> list[KernelResult]:
    """One row per handoff size: the Triton checksum's GB/s, the reference's as the peer."""
    row_bytes = block_layout(context.config, BLOCK_TOKENS, torch.bfloat16, "auto").nbytes
    return [_row(mib, row_bytes, context) for mib in HANDOFF_MIB]


def _row(mib: int, row_bytes: int, context: KernelBenchContext) -> KernelResult:
    count = max(1, (mib << 20) // row_bytes)
    storage = torch.randint(0, 256, (count, row_bytes), dtype=torch.uint8, device=context.device)
    ids = torch.randperm(count, device=context.device)
    nbytes = count * row_bytes
    ours = device_us(lambda: keyed_triton.keyed_rows_checksum(storage, ids, 0, KEY))
    peer = device_us(lambda: naive.keyed_rows_checksum(storage, ids, 0, KEY))
    return KernelResult(
        "checksum",
        f"{nbytes / (1 << 20):.0f} MiB handoff, {count} rows of {row_bytes} B",
        nbytes / ours / 1e3,
        "GB/s",
        context.copy_bytes_per_s / 1e9,
        "copy",
        nbytes / peer / 1e3,
        "torch reference",
    )
