"""``Supervisor``: the local cluster's watcher, restarting a managed process (a worker, the node's tier)
on its port when it exits."""

import logging
import threading

from .managed_process import ManagedProcess

log = logging.getLogger("deploy.local.launcher")


class Supervisor:
    """A thread that checks ``processes`` every ``interval_s`` and starts again each one that exited
    (counted in its ``restarts``; logged as an error unless it exited 0, a drain after SIGTERM).

    Args:
        processes: what to watch, in the order they are restarted (the tier before the workers).
        ready_timeout_s: how long a restart may take to become ready.
        interval_s: how often to check.
    """

    def __init__(self, processes: list[ManagedProcess], ready_timeout_s: float, interval_s: float = 0.5):
        self.processes = processes
        self.ready_timeout_s = ready_timeout_s
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """No restart begins after this (one under way may still finish: not waited for, it can take
        ``ready_timeout_s``)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for process in self.processes:
                if not process.alive() and not self._stop.is_set():
                    code = process.process.poll() if process.process else None
                    level = logging.INFO if code == 0 else logging.ERROR  # 0: drained after SIGTERM
                    name, port = process.name, process.port
                    log.log(level, "%s exited (code %s); restarting it on port %d", name, code, port)
                    process.restarts += 1
                    try:
                        process.start(self.ready_timeout_s)
                    except RuntimeError as error:
                        log.error("%s", error)
