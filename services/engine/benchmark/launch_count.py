"""How many kernel launches one call costs: the CPU-side launch calls (a replayed CUDA graph is one)
and the GPU kernels they run, counted with ``torch.profiler``; and which kernels took its GPU time."""

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


BUSIEST = 12  # kernels kept in ``LaunchCount.busiest``


@dataclass(frozen=True)
class KernelTime:
    """One GPU kernel's share of a call: how often it ran and its summed device time."""

    name: str
    calls: int
    total_us: float


@dataclass(frozen=True)
class LaunchCount:
    """``launches``: launch calls the host made; ``kernels``: GPU kernels that ran; ``busiest``: the
    ``BUSIEST`` kernels (by name) with the most device time, most first; ``kernel_us``: all kernels'."""

    launches: int
    kernels: int
    busiest: tuple[KernelTime, ...] = ()
    kernel_us: float = 0.0


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
    on_device = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, tuple[int, float]] = {}
    for event in on_device:
        calls, total = by_name.get(event.name, (0, 0.0))
        by_name[event.name] = (calls + 1, total + event.time_range.elapsed_us())
    busiest = sorted((KernelTime(n, c, t) for n, (c, t) in by_name.items()), key=lambda k: -k.total_us)
    return LaunchCount(
        launches=launches,
        kernels=len(on_device),
        busiest=tuple(busiest[:BUSIEST]),
        kernel_us=sum(t for _, t in by_name.values()),
    )
