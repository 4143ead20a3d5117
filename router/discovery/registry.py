"""Discovery backends by name, built and checked from the router's configuration."""

from .base import Discovery
from .static import StaticDiscovery

KINDS = ("static", "kubernetes")


def discovery_for(config) -> Discovery:
    """The ``Discovery`` that ``config.discovery`` names, its fields checked.

    ``config`` is a ``RouterConfig`` (duck-typed: ``discovery``, ``prefill``, ``decode``,
    ``namespace``, ``prefill_selector``, ``decode_selector``, ``port_name``, ``disaggregation``).

    Raises:
        ValueError: naming the field to fix.
    """
    colocated = config.disaggregation == "never"
    kubernetes_fields = ("namespace", "prefill_selector", "decode_selector")
    if config.discovery == "static":
        for name in kubernetes_fields:
            if getattr(config, name):
                raise ValueError(f"{name}: only used with discovery='kubernetes'")
        if not config.decode:
            raise ValueError("decode: static discovery needs at least one decode worker address")
        if not config.prefill and not colocated:
            raise ValueError(
                "prefill: disaggregated serving needs at least one prefill worker (or disaggregation='never')"
            )
        for name in ("prefill", "decode"):
            for address in getattr(config, name):
                _check_address(name, address)
        return StaticDiscovery(list(config.prefill), list(config.decode))
    if config.discovery == "kubernetes":
        for name in ("prefill", "decode"):
            if getattr(config, name):
                raise ValueError(f"{name}: fixed addresses cannot be combined with discovery='kubernetes'")
        if not config.prefill_selector and not colocated:
            raise ValueError(
                "prefill_selector: disaggregated serving needs a label selector for prefill workers "
                "(or disaggregation='never')"
            )
        from .k8s import KubernetesDiscovery  # the kubernetes client loads only when used

        return KubernetesDiscovery(
            config.namespace, config.prefill_selector, config.decode_selector, config.port_name
        )
    raise ValueError(f"discovery: {config.discovery!r} is not one of {', '.join(KINDS)}")


def _check_address(field: str, address: str) -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{field}: expected host:port, got {address!r}")
