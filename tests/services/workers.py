"""Real worker processes for tests: the launcher's own ``ManagedWorker``, stopped whatever happens."""

import contextlib
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
    """Start one worker per ``(role, *flags)`` spec, yield them in order, stop them all on exit (also
    when one of them fails to start)."""
    started: list[WorkerProcess] = []
    try:
        for role, *flags in specs:
            started.append(WorkerProcess(role, model, *flags))
        yield started
    finally:
        for process in started:
            process.stop()
