"""Where UCX, NIXL's transport, may listen: on the interface the process serves its gRPC on.

A UCX worker opens TCP listeners on every network device it finds unless told otherwise, so a worker
whose gRPC binds loopback (``baton serve``'s local cluster) still accepted UCX connections on the
machine's external address. ``confine_ucx`` sets ``UCX_NET_DEVICES=lo`` for a loopback host before the
process makes its first NIXL agent (shared-memory and CUDA transports are not network devices and are
unaffected). Any other host (a pod IP, ``0.0.0.0``) keeps UCX's choice, as a value the operator set
does: across machines the handoff needs the cluster's network (docs/authentication.md, "KV data
plane").
"""

import ipaddress
import os
from collections.abc import MutableMapping

UCX_DEVICES = "UCX_NET_DEVICES"
LOOPBACK_DEVICE = "lo"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) names the loopback interface."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def confine_ucx(host: str, environ: MutableMapping[str, str] = os.environ) -> bool:
    """Keep UCX's listeners on loopback when ``host`` is loopback and ``UCX_NET_DEVICES`` is unset;
    returns whether it set it. Call before the process's first NIXL agent."""
    if not is_loopback(host) or UCX_DEVICES in environ:
        return False
    environ[UCX_DEVICES] = LOOPBACK_DEVICE
    return True
