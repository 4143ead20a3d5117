"""``RedisServer``: a local ``redis-server`` process on a free port (``baton serve`` without
``--redis-url``, and the tests' Redis). In memory only: no RDB or AOF files, so a restart starts
empty, as HiCache's index expects of a restarted Redis (publishers rewrite their sets)."""

import shutil
import socket
import subprocess
import time

import redis

BINARY = "redis-server"


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the OS's pick)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


class RedisServer:
    """A ``redis-server`` child process; ``url`` is where it listens.

    Args:
        port: 0 picks a free one; a given port is kept across ``stop`` / ``start`` (a restart).
        host: the interface it listens on.

    Raises:
        FileNotFoundError: no ``redis-server`` on PATH (``make redis`` installs Debian's).
    """

    def __init__(self, port: int = 0, host: str = "127.0.0.1"):
        self.binary = shutil.which(BINARY)
        if self.binary is None:
            raise FileNotFoundError(
                f"{BINARY}: not found on PATH (install it: `make redis`, or give --redis-url / --no-redis)"
            )
        self.host = host
        self.port = port or free_port(host)
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}"

    def start(self, ready_timeout_s: float = 10.0) -> "RedisServer":
        """Start it and wait until it answers PING.

        Raises:
            RuntimeError: it exited or did not answer within ``ready_timeout_s`` (its output included).
        """
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", self.host, "--save", "", "--appendonly", "no"]
            + ["--loglevel", "warning"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        client = redis.Redis(host=self.host, port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + ready_timeout_s
        try:
            while time.monotonic() < deadline and self.process.poll() is None:
                try:
                    client.ping()
                    return self
                except redis.exceptions.ConnectionError:
                    time.sleep(0.02)
        finally:
            client.close()
        if self.process.poll() is None:
            self.process.kill()
        output, _ = self.process.communicate(timeout=10)
        raise RuntimeError(f"{BINARY} on {self.url} did not start:\n{output[-2000:]}")

    def stop(self) -> None:
        """Kill it (SIGKILL: what a crash looks like to its clients) and wait for it to exit."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()
