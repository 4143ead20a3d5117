"""Transfer backends by name (``make_backend("nixl")``).

Each entry imports its backend lazily, so choosing one backend never imports another's library.
To add a backend (for example ``"grpc_bytes"``, which sends row bytes inside the gRPC call for
machines without RDMA), subclass ``TransferBackend`` in its own module and add one factory below.
"""

from collections.abc import Callable

from .backend import TransferBackend


def _make_nixl(agent_name: str | None) -> TransferBackend:
    from .nixl_backend import NixlBackend

    return NixlBackend(agent_name)


_FACTORIES: dict[str, Callable[[str | None], TransferBackend]] = {
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
