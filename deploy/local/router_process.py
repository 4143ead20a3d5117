"""``baton router`` in its own process, as deployed: its own GIL, its own life (killed and started
again on the same port). The router-latency benchmark and the lifecycle tests run it this way."""

import subprocess
import sys
import threading

from .launcher import REPO


class RouterProcess:
    """A router process over fixed workers.

    Args:
        model: the checkpoint folder (config, tokenizer).
        prefill: ``host:port`` of each prefill worker.
        decode: ``host:port`` of each decode worker.
        flags: more ``baton router`` flags (``--colocated``, ``--always-disaggregate``, ...).

    ``port`` and ``metrics_port`` are where it listens once ``start`` returns; a restart keeps ``port``.
    """

    def __init__(self, model: str, prefill: list[str], decode: list[str], *flags: str):
        self.command = [
            sys.executable,
            "-m",
            "cli.main",
            "router",
            "--model",
            str(model),
            "--prefill",
            ",".join(prefill),
            "--decode",
            ",".join(decode),
            *flags,
        ]
        self.port = 0
        self.metrics_port = 0
        self.process: subprocess.Popen | None = None

    def start(self, ready_timeout_s: float = 120.0) -> None:
        """Start it and wait for its READY line.

        Raises:
            RuntimeError: it printed something else, or nothing within ``ready_timeout_s``.
        """
        self.process = subprocess.Popen(
            [*self.command, "--port", str(self.port)], cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        line = _read_line(self.process, ready_timeout_s)
        if not line.startswith("READY "):
            self.kill()
            raise RuntimeError(f"the router did not start: {line!r}")
        fields = dict(field.split("=", 1) for field in line.split()[1:])
        self.port, self.metrics_port = int(fields["port"]), int(fields["metrics_port"])

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, its connections just drop."""
        self.process.kill()
        self.process.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM (the router drains), then SIGKILL if it hangs."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def _read_line(process: subprocess.Popen, timeout_s: float) -> str:
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return lines[0] if lines else ""
