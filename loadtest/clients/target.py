"""Where a load test sends its requests: ``grpc://HOST:PORT`` or ``http://HOST:PORT``.

There is no default target. A loopback host is always accepted; any other host only when the user
named it explicitly (``--target`` / ``--metrics-url``), so nothing is ever sent to a remote machine
by accident (a default, a config file, a test).
"""

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

SCHEMES = ("grpc", "http")
_LOOPBACK_NAMES = ("localhost",)


@dataclass(frozen=True)
class Target:
    """A parsed target. ``url`` is the base (``http://h:p``), ``address`` is ``host:port``."""

    scheme: str
    host: str
    port: int

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}"


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses (127.0.0.0/8, ::1)."""
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_target(
    text: str, *, explicit: bool, flag: str = "--target", schemes: tuple[str, ...] = SCHEMES
) -> Target:
    """Parse ``SCHEME://HOST:PORT``.

    Args:
        text: the URL (a trailing ``/`` is allowed; any other path is refused).
        explicit: the user typed this target; only then may the host be a remote one.
        flag: named in error messages.
        schemes: accepted schemes.

    Raises:
        ValueError: naming ``flag``, for a missing target, a bad scheme, host or port, or a
            non-loopback host that was not given explicitly.
    """
    if not text:
        raise ValueError(f"{flag}: a target is required, e.g. grpc://127.0.0.1:50051")
    parts = urlsplit(text)
    if parts.scheme not in schemes:
        wanted = " or ".join(f"{s}://HOST:PORT" for s in schemes)
        raise ValueError(f"{flag}: expected {wanted}, got {text!r}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None or port == 0:
        raise ValueError(f"{flag}: expected a host and a port in {text!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError(f"{flag}: expected only SCHEME://HOST:PORT, got {text!r}")
    if not explicit and not is_loopback(parts.hostname):
        raise ValueError(f"{flag}: {parts.hostname} is not a loopback address; name it explicitly")
    return Target(parts.scheme, parts.hostname, port)
