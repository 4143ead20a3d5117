"""Torch threads per worker process, for cluster benchmarks on small machines."""

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def worker_threads(threads: int) -> Iterator[None]:
    """Worker processes inherit this process's environment (restarts included): give each
    ``threads`` torch threads, so on a small machine the processes do not fight over cores."""
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved
