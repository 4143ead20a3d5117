"""Real worker processes for tests: the launcher's own ``ManagedWorker``, stopped whatever happens."""

import contextlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from deploy.local.launcher import REPO, ManagedWorker
from services.config_flags import worker_config_from_flags

__all__ = ["REPO", "WorkerProcess", "running_workers"]


class WorkerProcess:
    """``baton worker`` in a subprocess, READY on return; ``address`` is where it listens."""

    def __init__(self, role: str, model: Path, *extra: str, ready_timeout_s: float = 120.0):
        flags = ["--role", role, "--name", f"{role}-test", "--model", str(model), *extra]
        self.worker = ManagedWorker(worker_config_from_flags(flags))
        self.worker.start(ready_timeout_s)

    @property
    def address(self) -> str:
        return self.worker.address

    def stop(self) -> None:
        self.worker.stop()


@contextlib.contextmanager
def running_workers(model: Path, *specs: tuple[str, ...]):
    """Start one worker per ``(role, *flags)`` spec, all at once (each pays its imports and model load
    while the others do), yield them in order, stop them all at once on exit (also when one fails to
    start)."""
    with ThreadPoolExecutor(max_workers=max(1, len(specs))) as pool:
        starting = [pool.submit(WorkerProcess, role, model, *flags) for role, *flags in specs]
    started = [future.result() for future in starting if future.exception() is None]
    try:
        for future in starting:
            future.result()  # the first worker that failed to start, raised here
        yield started
    finally:
        with ThreadPoolExecutor(max_workers=max(1, len(started))) as pool:
            list(pool.map(WorkerProcess.stop, started))  # each drains its grace period at the same time
