"""A real decode worker process for the router tests here (one per test module)."""

import pytest

from tests.services.workers import WorkerProcess


@pytest.fixture(scope="module")
def decode_worker(tiny_checkpoint):
    """``(checkpoint folder, WorkerProcess)`` of a float32 Kimi-Linear decode worker."""
    model = tiny_checkpoint("kimi_linear")
    process = WorkerProcess("decode", model, "--dtype", "float32")
    yield model, process
    process.stop()
