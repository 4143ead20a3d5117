"""Transfer bandwidth: a backend's writes into a second process against an in-process ``torch`` copy.

The in-process copy of the same bytes is the limit a transfer can approach (host to host, GPU to
the same GPU, or GPU to another GPU: the copy goes between the same two devices as the transfer);
the ratio says how close a backend (NIXL, gRPC bytes) gets (``baton bench transfer`` prints it).
Each size is one contiguous row, so this measures one descriptor per write, including the per-write
request setup a handoff pays.
"""

import multiprocessing
import statistics
import time

import torch

from common.errors import TransferError

from .registry import make_backend

_TARGET_BYTES = 256 << 20  # per size, enough repeats to move about this much
_MIN_ITERS, _MAX_ITERS, _WARMUP = 5, 200, 2
_RECEIVER_MAX_LIFE_S = 3600.0


def measure_bandwidth(
    sizes_bytes: list[int],
    backend: str = "nixl",
    timeout_s: float = 120.0,
    device: str = "cpu",
    peer_device: str | None = None,
) -> list[dict]:
    """Time writes of each size from this process into a freshly spawned receiver process.

    Args:
        sizes_bytes: payload sizes to measure (each > 0).
        backend: transfer backend name.
        timeout_s: bound on the receiver's start-up and on each write.
        device: where the sender's buffers live (``cpu``, ``cuda:0``).
        peer_device: where the receiver's buffers live (default: ``device``).

    Returns:
        one dict per size: ``size_bytes``, ``iterations``, ``transfer_gbps`` and ``memcpy_gbps``
        (median over iterations, 1e9 bytes/s), ``ratio`` (transfer / memcpy), ``backend``.
    """
    if not sizes_bytes or any(size <= 0 for size in sizes_bytes):
        raise ValueError(f"sizes_bytes: need positive sizes, got {sizes_bytes}")
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    peer_device = peer_device or device
    receiver = ctx.Process(
        target=_receiver_main, args=(child, backend, sizes_bytes, timeout_s, peer_device), daemon=True
    )
    receiver.start()
    try:
        if not parent.poll(timeout_s):
            raise TransferError(f"bandwidth receiver did not start within {timeout_s} s")
        endpoint = parent.recv()
        if isinstance(endpoint, Exception):
            raise endpoint
        with make_backend(backend) as sender:
            sources = []
            for index, size in enumerate(sizes_bytes):
                source = torch.randint(0, 256, (1, size), dtype=torch.uint8, device=device)
                sender.register(f"bw{index}", source)
                sources.append(source)
            peer = sender.connect(endpoint)
            results = []
            for index, (size, source) in enumerate(zip(sizes_bytes, sources, strict=True)):
                iters = max(_MIN_ITERS, min(_MAX_ITERS, _TARGET_BYTES // size))
                copies = {f"bw{index}": [(0, 0)]}
                times = [
                    sender.write(peer, copies, timeout_s=timeout_s).seconds for _ in range(_WARMUP + iters)
                ]
                transfer_s = statistics.median(times[_WARMUP:])
                memcpy_s = _time_copy(source, iters, peer_device)
                results.append(
                    {
                        "backend": backend,
                        "size_bytes": size,
                        "iterations": iters,
                        "transfer_gbps": size / transfer_s / 1e9,
                        "memcpy_gbps": size / memcpy_s / 1e9,
                        "ratio": memcpy_s / transfer_s,
                    }
                )
            return results
    finally:
        _stop(parent, receiver)


def measure_copy_bandwidth(
    sizes_bytes: list[int], device: str = "cpu", peer_device: str | None = None
) -> list[float]:
    """GB/s of a plain in-process copy per size from ``device`` to ``peer_device`` (default: the same),
    timed with no receiver running (the machine's limit).

    Copies timed inside ``measure_bandwidth`` share the cores with the receiver process and its
    threads; on a 2-core host that made them unreliable, so the benchmark's limit column uses this.
    """
    rates = []
    for size in sizes_bytes:
        iters = max(_MIN_ITERS, min(_MAX_ITERS, _TARGET_BYTES // size))
        source = torch.randint(0, 256, (1, size), dtype=torch.uint8, device=device)
        rates.append(size / _time_copy(source, iters, peer_device or device) / 1e9)
    return rates


def _time_copy(source: torch.Tensor, iters: int, dest_device: str) -> float:
    """Median seconds of ``dest.copy_(source)`` into a separate buffer on ``dest_device`` (GPU copies
    are synchronised, so each time covers the whole copy)."""
    dest = torch.empty_like(source, device=dest_device)
    on_gpu = source.is_cuda or dest.is_cuda
    times = []
    for _ in range(_WARMUP + iters):
        if on_gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        dest.copy_(source)
        if on_gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[_WARMUP:])


def _receiver_main(conn, backend: str, sizes_bytes: list[int], timeout_s: float, device: str) -> None:
    """Spawned receiver: register one row per size on ``device``, publish the endpoint, wait for "stop"."""
    try:
        receiver = make_backend(backend)
        buffers = [torch.zeros(1, size, dtype=torch.uint8, device=device) for size in sizes_bytes]
        for index, buffer in enumerate(buffers):
            receiver.register(f"bw{index}", buffer)
        conn.send(receiver.endpoint())
    except Exception as exc:
        conn.send(TransferError(f"bandwidth receiver failed: {exc}"))
        return
    # Returns on "stop", or on end-of-file when the parent dies without sending it; bounded anyway.
    conn.poll(_RECEIVER_MAX_LIFE_S)
    receiver.close()


def _stop(conn, process) -> None:
    try:
        conn.send("stop")
    except (BrokenPipeError, OSError):
        pass
    process.join(5)
    if process.is_alive():
        process.kill()
        process.join(5)
    conn.close()
