"""The limits every benchmark table divides by: device copy bandwidth and matrix-multiply rate.

Both are measured in the same run as what they bound (a datasheet number is not what this device
reaches today). ``HBM_BYTES_PER_S`` is the H200 figure the issue's table uses, printed beside them.
"""

import torch

from .timing import timed

HBM_BYTES_PER_S = 4.3e12  # H200 HBM3e, what a device-to-device copy reaches (issue 12's table)


def copy_bandwidth(device: str, nbytes: int | None = None) -> float:
    """Bytes per second a device-local copy moves (read + write counted), over ``nbytes`` buffers
    (default 1 GiB on a GPU, 64 MiB on the CPU)."""
    nbytes = nbytes or ((1 << 30) if device.startswith("cuda") else (64 << 20))
    source = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dest = torch.empty_like(source)
    return 2 * nbytes / timed(device, lambda: dest.copy_(source))


def matmul_rate(device: str, dtype: torch.dtype, size: int | None = None) -> float:
    """Floating-point operations per second of a square ``size`` matrix product in ``dtype``
    (default 8192 on a GPU, 1024 on the CPU)."""
    size = size or (8192 if device.startswith("cuda") else 1024)
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    return 2 * size**3 / timed(device, lambda: a @ b)
