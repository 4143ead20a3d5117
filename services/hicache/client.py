"""``HostCacheClient``: a worker's side of ``baton cache``, with ``HostTier``'s methods over gRPC.

It satisfies ``HostTierPort``, so engine code takes an in-process tier or a remote one alike. The page bytes
never travel here: after ``attach``, a worker connects its own transfer backend to ``endpoint()`` and reads /
writes the rows its leases name (regions ``"blocks"``: KV pages, ``"state"``: KDA pages, the names of its own
pools).

A dead or restarted tier never fails a request. While the service cannot be reached, ``match`` and
``begin_get`` answer a miss, ``reserve_put`` a lease with no page (nothing to write), and the lease calls are
skipped; the client logs one line per outage, counts the calls it answered so (``skipped_calls``) and tries
to attach again every ``retry_s``. A tier that came back as another run (its ``tier_id`` changed: pages,
leases and NIXL agent gone) is attached again with the same layouts; ``epoch`` then grows, telling the worker
to reconnect its transfer backend to the new ``endpoint()``. The lease ids this client hands out carry the
epoch (``epoch << 40 | the tier's id``): a lease call naming a lease of a run that is gone is skipped, so it
can never end a lease of the new run that happens to have the same number.

A restarted run that another layout attached to first refuses this client's layouts: the client then answers
as while the tier is down (misses, no room), logs the refusal once (naming the field), counts it in
``refusals`` and asks again every ``retry_s`` (the tier may be restarted once more, for this layout).

Errors that remain: INVALID_ARGUMENT (and FAILED_PRECONDITION from an explicit ``attach``) become
``ValueError`` naming the field -- a worker bug or another layout at the first attach, not an outage.
"""

import logging
import threading
import time
from collections.abc import Callable, Sequence

import grpc

from common.internal_tls import InternalTls, insecure_or_internal_channel
from common.rpc.cluster_secret_interceptor import with_cluster_secret
from proto.baton.v1 import host_cache_pb2, host_cache_pb2_grpc
from services.rpc.convert import endpoint_from_pb
from services.transfer import TransferEndpoint

from .host_tier import KDA, KV, NO_LEASE, GetLease, KindStats, PutLease, TierMatch
from .shared_pages import SharedPages

log = logging.getLogger(__name__)

EPOCH_SHIFT = 40  # a client lease id: epoch << EPOCH_SHIFT | the tier run's lease id
MISS = TierMatch(0, (), 0)


class HostCacheClient:
    """One channel to a ``baton cache`` service, tolerant of the service dying and coming back.

    Args:
        address: ``HOST:PORT`` of the service.
        timeout_s: deadline of each call.
        prefetch_timeout_s: deadline of a ``Prefetch`` (nobody waits on it longer than its policy says).
        retry_s: after a failed call, how long calls are answered without the tier before it is tried again.
        clock: monotonic seconds (tests pass their own).
        cluster_secret: sent on every call (``--cluster-secret-file``); "": none.

    Attributes:
        epoch: how many tier runs this client attached to (1 after the first ``attach`` that reached it).
        skipped_calls: calls answered as a miss or skipped because the tier could not be reached.
        has_l3: the tier run attached to has a Redis L3 (``prefetch`` asks it only then).
        outages: how many times the tier became unreachable (one log line each).
        reconnects: how many times this client attached again after having attached once: to the same
            run after an outage, or to a restarted run.
        refusals: how many times a restarted run refused this client's layouts (one log line each).
    """

    def __init__(
        self,
        address: str,
        timeout_s: float = 5.0,
        retry_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        prefetch_timeout_s: float = 30.0,
        cluster_secret: str = "",
        internal_tls: InternalTls | None = None,
    ):
        self.address = address
        self.timeout_s = timeout_s
        self.prefetch_timeout_s = prefetch_timeout_s
        self.retry_s = retry_s
        self.layout_fingerprint = ""
        self.epoch = 0
        self.skipped_calls = 0
        self.outages = 0
        self.has_l3 = False
        self.reconnects = 0
        self.refusals = 0
        self._clock = clock
        self._layout: tuple[str, int, int] | None = None
        self._endpoint: TransferEndpoint | None = None
        self._shared: dict[str, SharedPages] = {}
        self._tier_id = ""
        self._down = False
        self._refused = ""  # why the run now answering refused this client's layouts ("": it did not)
        self._retry_at = 0.0
        self._lock = threading.Lock()
        # gRPC's reconnect backoff grows to minutes; keep it at our retry period so a restarted tier is
        # found within about retry_s.
        backoff_ms = max(100, int(retry_s * 1000))
        self._channel = with_cluster_secret(
            insecure_or_internal_channel(
                address,
                internal_tls,
                options=[
                    ("grpc.initial_reconnect_backoff_ms", min(backoff_ms, 1000)),
                    ("grpc.min_reconnect_backoff_ms", min(backoff_ms, 1000)),
                    ("grpc.max_reconnect_backoff_ms", backoff_ms),
                ],
            ),
            cluster_secret,
        )
        self._stub = host_cache_pb2_grpc.HostCacheStub(self._channel)

    def attach(
        self, layout_fingerprint: str, kv_page_bytes: int, kda_page_bytes: int
    ) -> TransferEndpoint | None:
        """Join the tier with this worker's layouts; returns the endpoint whose regions hold the pages, or
        ``None`` when the tier cannot be reached now (the client attaches by itself once it can).

        Raises:
            ValueError: the tier holds another layout, or a bad field (the message names it).
        """
        with self._lock:
            held = self._layout
            self._layout = (layout_fingerprint, kv_page_bytes, kda_page_bytes)
            try:
                self._attach(explicit=True)
            except ValueError:
                self._layout = held  # refused: keep the layouts this client attached with
                raise
            self.layout_fingerprint = layout_fingerprint
            return self._endpoint if not self._down else None

    @property
    def available(self) -> bool:
        """Whether the last call reached the tier (an attached, live run)."""
        return self._endpoint is not None and not self._down

    def endpoint(self) -> TransferEndpoint:
        """The endpoint of the tier run attached to (it changes when ``epoch`` does)."""
        if self._endpoint is None:
            raise ValueError("endpoint: not attached; call attach() first (or the tier was never reached)")
        return self._endpoint

    def shared_pages(self) -> dict[str, SharedPages]:
        """The tier run's arenas as shared-memory files, by kind (``KV``, ``KDA``); empty when it keeps
        them private (they change when ``epoch`` does)."""
        return dict(self._shared)

    def match(self, hashes: Sequence[bytes], has_state: bool) -> TierMatch:
        """``HostTier.match`` on the service; a miss without the tier or from a run not attached to."""
        response = self._call("Match", host_cache_pb2.MatchRequest(hashes=hashes, has_state=has_state))
        if response is None:
            return MISS
        if response.tier_id != self._tier_id:  # restarted since: attach to the new run, then ask it
            with self._lock:
                self._attach()
            return MISS
        return TierMatch(response.kv_depth, tuple(response.snapshot_depths), response.usable_depth)

    def reserve_put(self, kind: str, hashes: Sequence[bytes], tenant: str = "") -> PutLease:
        """``HostTier.reserve_put`` on the service; without the tier, a lease with no page to write."""
        request = host_cache_pb2.LeaseHashesRequest(kind=kind, hashes=hashes, tenant=tenant)
        response = self._call("ReservePut", request)
        if response is None:
            return PutLease(NO_LEASE, (None,) * len(hashes))
        pages = tuple(None if page < 0 else page for page in response.pages)
        return PutLease(self._client_lease(response.lease_id), pages, response.no_room)

    def commit_put(self, lease_id: int) -> None:
        """``HostTier.commit_put`` on the service (skipped for a lease of a tier run that is gone)."""
        tier_lease = self._tier_lease(lease_id)
        if tier_lease is not None:
            self._call("CommitPut", host_cache_pb2.LeaseRequest(lease_id=tier_lease))

    def abort_put(self, lease_id: int) -> None:
        """``HostTier.abort_put`` on the service (skipped likewise)."""
        tier_lease = self._tier_lease(lease_id)
        if tier_lease is not None:
            self._call("AbortPut", host_cache_pb2.LeaseRequest(lease_id=tier_lease))

    def begin_get(self, kind: str, hashes: Sequence[bytes]) -> GetLease:
        """``HostTier.begin_get`` on the service; without the tier, a lease of no page."""
        response = self._call("BeginGet", host_cache_pb2.LeaseHashesRequest(kind=kind, hashes=hashes))
        if response is None:
            return GetLease(NO_LEASE, ())
        lease_id = self._client_lease(response.lease_id)
        return GetLease(lease_id, tuple(response.pages), response.checksum_failures)

    def end_get(self, lease_id: int) -> None:
        """``HostTier.end_get`` on the service (skipped for a lease of a tier run that is gone)."""
        tier_lease = self._tier_lease(lease_id)
        if tier_lease is not None:
            self._call("EndGet", host_cache_pb2.LeaseRequest(lease_id=tier_lease))

    def prefetch(self, hashes: Sequence[bytes], has_state: bool, tenant: str = "") -> "RemotePrefetch":
        """Start the service's ``Prefetch`` without waiting (``PrefetchPort``; the pages ``tenant``'s): done
        once it answered or failed; at once without the tier (nothing fetched)."""
        with self._lock:
            skip = self._layout is None or self._down or not self.has_l3 or not hashes
        if skip:
            return RemotePrefetch(None)
        request = host_cache_pb2.PrefetchRequest(hashes=hashes, has_state=has_state, tenant=tenant)
        return RemotePrefetch(self._stub.Prefetch.future(request, timeout=self.prefetch_timeout_s))

    def record_lookup(self, kv_hits: int, kv_misses: int, kda_hits: int, kda_misses: int) -> None:
        """``HostTier.record_lookup`` on the service (skipped without the tier)."""
        request = host_cache_pb2.RecordLookupRequest(
            kv_hits=kv_hits, kv_misses=kv_misses, kda_hits=kda_hits, kda_misses=kda_misses
        )
        self._call("RecordLookup", request)

    def stats(self) -> dict[str, KindStats]:
        """``HostTier.stats`` on the service; empty without the tier."""
        response = self._call("Stats", host_cache_pb2.TierStatsRequest())
        if response is None:
            return {}
        return {
            kind.kind: KindStats(**{field: getattr(kind, field) for field in KindStats.__dataclass_fields__})
            for kind in response.kinds
        }

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    # ---- internals ---------------------------------------------------------------------------

    def _client_lease(self, tier_lease: int) -> int:
        """This client's id of the tier's lease ``tier_lease`` (``NO_LEASE`` stays ``NO_LEASE``: no call
        ends it)."""
        if tier_lease == NO_LEASE:
            return NO_LEASE
        if tier_lease >> EPOCH_SHIFT:
            raise ValueError(f"lease_id: the tier's {tier_lease} does not fit {EPOCH_SHIFT} bits")
        return self.epoch << EPOCH_SHIFT | tier_lease

    def _tier_lease(self, lease_id: int) -> int | None:
        """The tier's id of ``lease_id``; ``None`` for ``NO_LEASE`` or a lease of a run that is gone."""
        if lease_id >> EPOCH_SHIFT != self.epoch or lease_id == NO_LEASE:
            return None
        return lease_id & ((1 << EPOCH_SHIFT) - 1)

    def _call(self, method: str, request):
        """The response, or ``None`` when the tier cannot be reached (counted; the outage logged once)."""
        with self._lock:
            if self._layout is None:
                raise ValueError(f"{method}: not attached; call attach() first")
            if self._down and (self._clock() < self._retry_at or not self._attach()):
                self.skipped_calls += 1
                return None
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout_s)
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise ValueError(error.details()) from None
            with self._lock:
                if error.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    self._attach()  # a new run nobody attached to yet: this call is a miss, the next a hit
                else:
                    self._lost(f"{method}: {error.code().name}")
                self.skipped_calls += 1
            return None

    def _attach(self, explicit: bool = False) -> bool:
        """Attach with the recorded layouts (under the lock); whether the tier answered and took them.

        Raises:
            ValueError: ``explicit`` (``attach()``) and the tier refused the layouts or a field.
        """
        fingerprint, kv_page_bytes, kda_page_bytes = self._layout
        request = host_cache_pb2.AttachRequest(
            layout_fingerprint=fingerprint, kv_page_bytes=kv_page_bytes, kda_page_bytes=kda_page_bytes
        )
        try:
            response = self._stub.Attach(request, timeout=self.timeout_s)
        except grpc.RpcError as error:
            refused = error.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
            if refused and explicit:
                raise ValueError(error.details()) from None
            if refused:
                self._refuse(error.details())
            else:
                self._lost(f"Attach: {error.code().name}")
            return False
        self.has_l3 = response.l3
        if self._tier_id and (self._down or response.tier_id != self._tier_id):
            self.reconnects += 1
        self._refused = ""
        if response.tier_id != self._tier_id:
            if self._tier_id:
                log.warning("host cache %s: attached to a restarted tier (its pages are gone)", self.address)
            self._tier_id = response.tier_id
            self._endpoint = endpoint_from_pb(response.endpoint)
            self._shared = {
                kind: SharedPages(pages.node_id, pages.path, pages.num_pages, pages.page_bytes)
                for kind, pages in ((KV, response.shared_kv), (KDA, response.shared_kda))
                if pages.path
            }
            self.epoch += 1
        elif self._down:
            log.warning("host cache %s: reachable again", self.address)
        self._down = False
        return True

    def _refuse(self, details: str) -> None:
        """A run (restarted, attached first by another layout) refused this client's layouts: answer misses
        and ask again in ``retry_s`` (under the lock); logged once per refusal."""
        if details != self._refused:
            self.refusals += 1
            log.error(
                "host cache %s refused this worker's layouts after a restart (%s): answering misses, "
                "asking again every %.1f s",
                self.address,
                details,
                self.retry_s,
            )
        self._refused = details
        self._down = True
        self._retry_at = self._clock() + self.retry_s

    def _lost(self, what: str) -> None:
        """The tier did not answer: calls are misses until ``retry_s`` from now (under the lock)."""
        if not self._down:
            self.outages += 1
            log.warning(
                "host cache %s unreachable (%s): answering misses, retrying every %.1f s",
                self.address,
                what,
                self.retry_s,
            )
        self._down = True
        self._retry_at = self._clock() + self.retry_s


class RemotePrefetch:
    """A ``Prefetch`` call in flight (``PrefetchHandle``): ``done()`` once it answered or failed (a
    failure is a prefetch that fetched nothing: the request then misses what it would have loaded)."""

    def __init__(self, future: grpc.Future | None):
        self._future = future

    def done(self) -> bool:
        return self._future is None or self._future.done()

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once the call answered or failed (at once when it has, or without a call)."""
        if self._future is None:
            fn()
        else:
            self._future.add_done_callback(lambda _future: fn())

    def pages(self) -> tuple[int, int]:
        """``(kv_pages, kda_pages)`` it brought into the tier; ``(0, 0)`` unfinished or failed."""
        if not self.done() or self._future is None or self._future.exception() is not None:
            return 0, 0
        response = self._future.result()
        return response.kv_pages, response.kda_pages
