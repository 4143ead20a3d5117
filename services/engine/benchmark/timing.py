"""How every benchmark here times its work: host-timed medians, device medians, CUDA-graph replays.

- ``synchronize``: the wait around a host-timed span.
- ``timed``: seconds, the device synchronised around each call (CPU or GPU; the limit probes and
  anything with host work in it, such as the per-row sampler).
- ``device_us``: microseconds, ``triton.testing.do_bench`` median with L2 flushed between runs (a
  kernel that is large beside its launch cost: prefill chunks, grouped GEMMs, device sampling).
- ``graph_us``: microseconds of one CUDA-graph replay, L2 flushed before each (a decode step, as the
  engine runs it: without the graph, about 45 us of Python launch cost hides every small kernel).
"""

import time
from collections.abc import Callable

import torch

_REPEATS = 10


def synchronize(device: str) -> None:
    """Wait for ``device``'s queued work (a no-op on the CPU)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(device: str, work: Callable[[], object], repeats: int = _REPEATS) -> float:
    """Median seconds of ``work()`` on ``device`` (after one warm-up call), synchronised around each."""
    on_gpu = device.startswith("cuda")
    work()
    times = []
    for _ in range(repeats):
        if on_gpu:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        work()
        if on_gpu:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def device_us(work: Callable[[], object], warmup_ms: int = 25, rep_ms: int = 100) -> float:
    """Median microseconds of ``work()`` on the current CUDA device (``do_bench``: L2 flushed between
    runs, about ``rep_ms`` of runs after ``warmup_ms`` of warm-up)."""
    from triton.testing import do_bench

    return do_bench(work, warmup=warmup_ms, rep=rep_ms, return_mode="median") * 1e3


def graph_us(work: Callable[[], object]) -> float:
    """Median microseconds of one CUDA-graph replay of ``work()`` (compiled and warmed on a side stream
    first, outside the capture), L2 flushed before each replay.

    ``work`` must read only device tensors (no host syncs), as a captured decode step does.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        work()
        work()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        work()
    return device_us(graph.replay)
