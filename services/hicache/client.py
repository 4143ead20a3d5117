"""``HostCacheClient``: a worker's side of ``baton cache``, with ``HostTier``'s methods over gRPC.

It satisfies ``HostTierPort``, so engine code takes an in-process tier or a remote one alike. The page bytes
never travel here: after ``attach``, a worker connects its own transfer backend to ``endpoint()`` and reads /
writes the rows its leases name (regions ``"blocks"``: KV pages, ``"state"``: KDA pages, the names of its own
pools).

Errors: INVALID_ARGUMENT and FAILED_PRECONDITION become ``ValueError`` (the message names the field); any
other failure, the tier being unreachable included, is a ``TransferError`` (recompute instead).
"""

from collections.abc import Sequence

import grpc

from common.errors import TransferError
from proto.baton.v1 import host_cache_pb2, host_cache_pb2_grpc
from services.rpc.convert import endpoint_from_pb
from services.transfer import TransferEndpoint

from .host_tier import GetLease, KindStats, PutLease, TierMatch

_CALLER_ERRORS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)


class HostCacheClient:
    """One channel to a ``baton cache`` service.

    Args:
        address: ``HOST:PORT`` of the service.
        timeout_s: deadline of each call.
    """

    def __init__(self, address: str, timeout_s: float = 5.0):
        self.address = address
        self.timeout_s = timeout_s
        self.layout_fingerprint = ""
        self._endpoint: TransferEndpoint | None = None
        self._channel = grpc.insecure_channel(address)
        self._stub = host_cache_pb2_grpc.HostCacheStub(self._channel)

    def attach(self, layout_fingerprint: str, kv_page_bytes: int, kda_page_bytes: int) -> TransferEndpoint:
        """Join the tier with this worker's layouts; returns the endpoint whose regions hold the pages.

        Raises:
            ValueError: the tier holds another layout (the message names the field).
        """
        request = host_cache_pb2.AttachRequest(
            layout_fingerprint=layout_fingerprint, kv_page_bytes=kv_page_bytes, kda_page_bytes=kda_page_bytes
        )
        response = self._call("Attach", request)
        self.layout_fingerprint = layout_fingerprint
        self._endpoint = endpoint_from_pb(response.endpoint)
        return self._endpoint

    def endpoint(self) -> TransferEndpoint:
        """The tier's transfer endpoint (``attach`` first)."""
        if self._endpoint is None:
            raise ValueError("endpoint: not attached; call attach() first")
        return self._endpoint

    def match(self, hashes: Sequence[bytes], has_state: bool) -> TierMatch:
        """``HostTier.match`` on the service."""
        response = self._call("Match", host_cache_pb2.MatchRequest(hashes=hashes, has_state=has_state))
        return TierMatch(response.kv_depth, tuple(response.snapshot_depths), response.usable_depth)

    def reserve_put(self, kind: str, hashes: Sequence[bytes]) -> PutLease:
        """``HostTier.reserve_put`` on the service."""
        response = self._call("ReservePut", host_cache_pb2.LeaseHashesRequest(kind=kind, hashes=hashes))
        return PutLease(response.lease_id, tuple(None if page < 0 else page for page in response.pages))

    def commit_put(self, lease_id: int) -> None:
        """``HostTier.commit_put`` on the service."""
        self._call("CommitPut", host_cache_pb2.LeaseRequest(lease_id=lease_id))

    def abort_put(self, lease_id: int) -> None:
        """``HostTier.abort_put`` on the service."""
        self._call("AbortPut", host_cache_pb2.LeaseRequest(lease_id=lease_id))

    def begin_get(self, kind: str, hashes: Sequence[bytes]) -> GetLease:
        """``HostTier.begin_get`` on the service."""
        response = self._call("BeginGet", host_cache_pb2.LeaseHashesRequest(kind=kind, hashes=hashes))
        return GetLease(response.lease_id, tuple(response.pages))

    def end_get(self, lease_id: int) -> None:
        """``HostTier.end_get`` on the service."""
        self._call("EndGet", host_cache_pb2.LeaseRequest(lease_id=lease_id))

    def stats(self) -> dict[str, KindStats]:
        """``HostTier.stats`` on the service."""
        response = self._call("Stats", host_cache_pb2.TierStatsRequest())
        return {
            kind.kind: KindStats(**{field: getattr(kind, field) for field in KindStats.__dataclass_fields__})
            for kind in response.kinds
        }

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def _call(self, method: str, request):
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout_s)
        except grpc.RpcError as error:
            if error.code() in _CALLER_ERRORS:
                raise ValueError(error.details()) from None
            raise TransferError(
                f"host cache {self.address}: {method} failed: {error.code().name}: {error.details()}"
            ) from None
