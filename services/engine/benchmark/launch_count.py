"""How many kernel launches one call costs: the CPU-side launch calls (a replayed CUDA graph is one)
and the GPU kernels they run, counted with ``torch.profiler``."""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

# Runtime and driver calls that start work on the GPU.
_LAUNCH_CALLS = (
    "cudaLaunchKernel",
    "cuLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernelEx",
    "cudaGraphLaunch",
)


@dataclass(frozen=True)
class LaunchCount:
    """``launches``: launch calls the host made; ``kernels``: GPU kernels that ran."""

    launches: int
    kernels: int


def count_launches(work: Callable[[], object]) -> LaunchCount | None:
    """Profile one ``work()``; None without CUDA (nothing is launched)."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        work()
        torch.cuda.synchronize()
    events = prof.events()
    launches = sum(1 for e in events if e.name in _LAUNCH_CALLS)
    kernels = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    return LaunchCount(launches=launches, kernels=kernels)
