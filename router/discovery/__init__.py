"""Where the router's workers are: a fixed list, or the Kubernetes API (``k8s.KubernetesDiscovery``)."""

from .base import Discovery, OnChange
from .registry import KINDS, discovery_for
from .static import StaticDiscovery

__all__ = ["KINDS", "Discovery", "OnChange", "StaticDiscovery", "discovery_for"]
