"""``Supervisor``: the local cluster's watcher, restarting a managed process (a worker, the node's tier)
on its port when it exits."""

import logging
import threading

from .managed_process import ManagedProcess

log = logging.getLogger("deploy.local.launcher")


class Supervisor:
    """A thread that checks ``processes`` every ``interval_s`` and starts again each one that exited
    (counted in its ``restarts``; logged as an error unless it exited 0, a drain after SIGTERM).

    Processes found exited in one check come back in waves of their ``restart_wave`` (the node's tier,
    wave 0, ready before the workers): the processes of a wave start at once and the next wave waits
    for them all, so a prefill and a decode worker that died together take one start's time, not two.

    Args:
        processes: what to watch.
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
            exited = [process for process in self.processes if not process.alive()]
            for wave in sorted({process.restart_wave for process in exited}):
                if self._stop.is_set():
                    return
                starts = [
                    threading.Thread(target=self._restart, args=(process,), name=f"restart-{process.name}")
                    for process in exited
                    if process.restart_wave == wave
                ]
                for start in starts:
                    start.start()
                for start in starts:
                    start.join()

    def _restart(self, process: ManagedProcess) -> None:
        code = process.process.poll() if process.process else None
        level = logging.INFO if code == 0 else logging.ERROR  # 0: drained after SIGTERM
        log.log(level, "%s exited (code %s); restarting it on port %d", process.name, code, process.port)
        process.restarts += 1
        try:
            process.start(self.ready_timeout_s)
        except RuntimeError as error:
            log.error("%s", error)
