"""Moving a request's cache state between processes: packed blocks and KDA state slots.

The receiver (decode) registers its block and slot pools and publishes a ``TransferEndpoint``; the
sender (prefill) connects to it and ``write``s ``(local row, remote row)`` pairs, tagged with the
request id, which the receiver sees as a ``Notification`` once the bytes have landed.

- ``endpoint.py``: ``TransferEndpoint`` / ``RegionInfo`` (what a peer sees). Failures raise
  ``common.errors.TransferError``.
- ``backend.py``: the ``TransferBackend`` interface and its checks, ``TransferStats``, ``Notification``.
- ``row_plan.py``: validating row pairs and coalescing them into spans (one descriptor per run).
- ``byte_plan.py``: ``ByteSpan`` and its checks, for ``write_bytes`` (any local bytes into any bytes of
  a peer's region: a parallel handoff's staging buffer into the decode ranks' pools).
- ``nixl_backend.py``: the NIXL (UCX) backend, host (``DRAM``) or GPU (``VRAM``) memory.
- ``grpc_bytes_backend.py``: plain bytes over a gRPC stream: the explicit fallback and the baseline.
- ``registry.py``: ``make_backend(name)`` (``nixl``, ``grpc_bytes``).
- ``bandwidth.py``: ``measure_bandwidth`` (a backend's writes between two processes) and
  ``measure_copy_bandwidth`` (the in-process copy that is the limit).
"""

from .backend import BLOCKS, DRAFT_BLOCKS, DRAFT_STATE, STATE, Notification, TransferBackend, TransferStats
from .endpoint import RegionInfo, TransferEndpoint
from .registry import known_backends, make_backend

__all__ = [
    "BLOCKS",
    "DRAFT_BLOCKS",
    "DRAFT_STATE",
    "STATE",
    "Notification",
    "RegionInfo",
    "TransferBackend",
    "TransferEndpoint",
    "TransferStats",
    "known_backends",
    "make_backend",
]
