"""Transfer backends by name (``make_backend("nixl")``).

Each entry imports its backend lazily, so choosing one backend never imports another's library.
``"nixl"`` does one-sided RDMA-style writes; ``"grpc_bytes"`` sends row bytes inside a gRPC call
(machines without RDMA, and the baseline NIXL is measured against). To add a backend, subclass
``TransferBackend`` in its own module and add one factory below.
"""

from collections.abc import Callable

from .backend import TransferBackend


def _make_nixl(agent_name: str | None) -> TransferBackend:
    from .nixl_backend import NixlBackend

    return NixlBackend(agent_name)


def _make_grpc_bytes(agent_name: str | None) -> TransferBackend:
    from .grpc_bytes_backend import GrpcBytesBackend

    return GrpcBytesBackend(agent_name)


_FACTORIES: dict[str, Callable[[str | None], TransferBackend]] = {
    "grpc_bytes": _make_grpc_bytes,
    "nixl": _make_nixl,
}


def known_backends() -> list[str]:
    """The names ``make_backend`` accepts."""
    return sorted(_FACTORIES)


def make_backend(name: str, agent_name: str | None = None) -> TransferBackend:
    """A new transfer backend.

    Args:
        name: one of ``known_backends()``.
        agent_name: this process's unique agent name (default: a random one).

    Raises:
        ValueError: ``name`` is not a known backend (the message lists the known ones).
    """
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown transfer backend {name!r}; known backends: {known_backends()}")
    return factory(agent_name)
