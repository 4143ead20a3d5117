"""UCX's listeners stay on the interface the worker serves on (``services/transfer/ucx_interfaces.py``):
a worker on 127.0.0.1 with the NIXL backend has no listening socket on any other address (read from
``/proc``: its sockets' inodes in the kernel's TCP tables); the rule itself on a fake environment."""

import ipaddress
import os
import sys
from pathlib import Path

import pytest

from services.transfer.ucx_interfaces import UCX_DEVICES, confine_ucx, is_loopback
from tests.services.workers import WorkerProcess

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp


def listening_addresses(pid: int) -> list[str]:
    """The local addresses of ``pid``'s listening TCP sockets."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN and fields[9] in inodes:
                found.append(_address(fields[1].split(":")[0]))
    return found


def _address(hex_address: str) -> str:
    """A /proc/net address (little-endian 32-bit words) as text."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    return str(address.ipv4_mapped or address) if address.version == 6 else str(address)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_loopback_worker_listens_on_loopback_only(tiny_checkpoint):
    worker = WorkerProcess("decode", tiny_checkpoint("kimi_linear"), "--dtype", "float32")
    try:
        addresses = listening_addresses(worker.worker.process.pid)
    finally:
        worker.stop()
    assert len(addresses) >= 3  # gRPC, /metrics and UCX's
    assert all(is_loopback(address) for address in addresses), addresses


@pytest.mark.parametrize(
    ("host", "given", "devices"),
    [
        ("127.0.0.1", None, "lo"),
        ("localhost", None, "lo"),
        ("::1", None, "lo"),
        ("127.0.0.1", "mlx5_0:1", "mlx5_0:1"),  # the operator's choice stands
        ("0.0.0.0", None, None),
        ("10.1.2.3", None, None),
    ],
)
def test_only_a_loopback_host_confines_ucx(host, given, devices):
    environ = {} if given is None else {UCX_DEVICES: given}
    assert confine_ucx(host, environ) == (given is None and devices is not None)
    assert environ.get(UCX_DEVICES) == devices
