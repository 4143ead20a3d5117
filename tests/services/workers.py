"""Start real worker processes for tests and stop them, whatever happens."""

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """``baton worker`` in a subprocess; ``port`` once it printed READY."""

    def __init__(self, role: str, model: Path, *extra: str, ready_timeout_s: float = 120.0):
        env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
        command = [
            sys.executable,
            "-m",
            "cli.main",
            "worker",
            "--role",
            role,
            "--model",
            str(model),
            "--name",
            f"{role}-test",
            *extra,
        ]
        self.process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        deadline = time.monotonic() + ready_timeout_s
        self.output: list[str] = []
        self.port = None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            self.output.append(line)
            if line.startswith("READY "):
                self.port = int(line.rsplit("port=", 1)[1])
                return
        self.stop()
        raise RuntimeError(f"{role} worker did not start:\n{''.join(self.output)}")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)
