"""The ``HostCache`` gRPC servicer: thin over a ``HostTier`` whose arenas a transfer backend exposes.

The tier has byte budgets from the start but no page size: the first worker's ``Attach`` gives the page sizes
and the layout fingerprint, sizes the arenas and registers them as the regions ``"blocks"`` / ``"state"``, the
names of a worker's own pools, so a worker's ``write`` and ``read`` map its pool rows to page rows with no
renaming. With ``shm_dir`` the arenas are shared-memory files (``shared_pages.py``) whose paths ``Attach``
also gives, so a worker on this machine maps them and copies rows itself. A later worker must bring the
same layouts (INVALID_ARGUMENT naming the field otherwise): a page holds one block or one state slot byte
for byte, so every worker that reads it must lay it out the same way.
Every call but ``Attach`` and ``Stats`` before the first ``Attach`` is FAILED_PRECONDITION. ``Attach`` and
``Match`` answer with ``tier_id``, random per servicer: a worker whose tier was restarted (its pages, leases
and NIXL agent gone) sees another id and attaches again. ``Prefetch`` waits for the tier's L3 (``l3``, set by
the server once the tier has one) to bring a chain in; without an L3 it answers at once with nothing.
"""

import logging
import threading
import uuid
from collections.abc import Callable, Sequence

import grpc
import torch

from proto.baton.v1 import host_cache_pb2, host_cache_pb2_grpc
from services.rpc.convert import endpoint_to_pb
from services.transfer import BLOCKS, STATE, TransferBackend

from .host_tier import KDA, KV, HostTier
from .shared_pages import SharedPages, create_pages, map_pages, remove_orphans, remove_pages
from .tier_l3 import TierL3

log = logging.getLogger(__name__)

HASH_BYTES = 32  # a SHA-256 block hash (common/prefix_hash.py)
PREFETCH_WAIT_S = 30.0  # the most a Prefetch call waits for the L3 (a worker does not wait on it)


class HostCacheServicer(host_cache_pb2_grpc.HostCacheServicer):
    """``HostCache`` over one tier (made at the first ``Attach``) and the backend that exposes it.

    Args:
        backend: the transfer backend the arenas are registered with (workers read and write them).
        kv_budget_bytes, kda_budget_bytes: each kind's host memory.
        pin: page-lock the arenas (``None``: when CUDA is available).
        shm_dir: make the arenas shared-memory files in this directory, which workers on this machine
            map and copy rows of directly (``shared_pages.py``); "": private memory, NIXL only.
        lease_ttl_s: a lease's life (``HostTier``): a worker that dies holding one frees it then.
        tenant_reserve_pages: pages each tenant keeps against other tenants' puts (``HostTier``; the
            tier is not told its workers' snapshot stride, so its KDA arena keeps the same number).
        on_tier: called with the tier once the first ``Attach`` has made it (e.g. to publish it to the
            cluster index), before that ``Attach`` answers.
    """

    def __init__(
        self,
        backend: TransferBackend,
        kv_budget_bytes: int,
        kda_budget_bytes: int,
        lease_ttl_s: float,
        pin: bool | None = None,
        on_tier: Callable[[HostTier], None] | None = None,
        shm_dir: str = "",
        tenant_reserve_pages: int = 0,
    ):
        self.backend = backend
        self.tenant_reserve_pages = tenant_reserve_pages
        self.on_tier = on_tier or (lambda tier: None)
        self.kv_budget_bytes = kv_budget_bytes
        self.kda_budget_bytes = kda_budget_bytes
        self.lease_ttl_s = lease_ttl_s
        self.pin = pin
        self.shm_dir = shm_dir
        self.shared: dict[str, SharedPages] = {}  # kind -> its file, once the tier is made in shm_dir
        self.tier: HostTier | None = None
        self.l3: TierL3 | None = None  # the tier's Redis L3, if the server gives it one
        self.tier_id = uuid.uuid4().hex
        self._attach_lock = threading.Lock()
        self._endpoint = None

    def Attach(self, request, context):  # noqa: N802 (gRPC method name)
        if not request.layout_fingerprint:
            raise ValueError("layout_fingerprint: empty; send the worker's block and slot layout fingerprint")
        if request.kv_page_bytes == 0:
            raise ValueError("kv_page_bytes: must be > 0 (one packed block's bytes)")
        with self._attach_lock:
            if self.tier is None:
                self._create(request)
            self._check_same_layout(request)
            return host_cache_pb2.AttachResponse(
                endpoint=self._endpoint,
                tier_id=self.tier_id,
                l3=self.l3 is not None,
                shared_kv=_shared_pb(self.shared.get(KV)),
                shared_kda=_shared_pb(self.shared.get(KDA)),
            )

    def Match(self, request, context):  # noqa: N802
        match = self._attached(context).match(_hashes(request.hashes), request.has_state)
        return host_cache_pb2.MatchResponse(
            kv_depth=match.kv_depth,
            snapshot_depths=match.snapshot_depths,
            usable_depth=match.usable_depth,
            tier_id=self.tier_id,
        )

    def ReservePut(self, request, context):  # noqa: N802
        lease = self._attached(context).reserve_put(request.kind, _hashes(request.hashes), request.tenant)
        pages = [-1 if page is None else page for page in lease.pages]
        return host_cache_pb2.ReservePutResponse(lease_id=lease.lease_id, pages=pages, no_room=lease.no_room)

    def CommitPut(self, request, context):  # noqa: N802
        self._attached(context).commit_put(request.lease_id)
        return host_cache_pb2.LeaseResponse()

    def AbortPut(self, request, context):  # noqa: N802
        self._attached(context).abort_put(request.lease_id)
        return host_cache_pb2.LeaseResponse()

    def BeginGet(self, request, context):  # noqa: N802
        lease = self._attached(context).begin_get(request.kind, _hashes(request.hashes))
        return host_cache_pb2.BeginGetResponse(
            lease_id=lease.lease_id, pages=lease.pages, checksum_failures=lease.checksum_failures
        )

    def EndGet(self, request, context):  # noqa: N802
        self._attached(context).end_get(request.lease_id)
        return host_cache_pb2.LeaseResponse()

    def RecordLookup(self, request, context):  # noqa: N802
        counts = (request.kv_hits, request.kv_misses, request.kda_hits, request.kda_misses)
        self._attached(context).record_lookup(*counts)
        return host_cache_pb2.LeaseResponse()

    def Stats(self, request, context):  # noqa: N802
        tier = self.tier
        if tier is None:
            return host_cache_pb2.TierStatsResponse()
        kinds = [
            host_cache_pb2.TierKindStats(kind=kind, **vars(stats)) for kind, stats in tier.stats().items()
        ]
        return host_cache_pb2.TierStatsResponse(layout_fingerprint=tier.layout_fingerprint, kinds=kinds)

    def Prefetch(self, request, context):  # noqa: N802
        self._attached(context)
        l3 = self.l3
        if l3 is None:
            return host_cache_pb2.PrefetchResponse()
        ticket = l3.prefetch(_hashes(request.hashes), request.has_state, request.tenant)
        ticket.wait(PREFETCH_WAIT_S)
        return host_cache_pb2.PrefetchResponse(kv_pages=ticket.kv_pages, kda_pages=ticket.kda_pages)

    # ---- internals ---------------------------------------------------------------------------

    def _create(self, request) -> None:
        kda_budget = self.kda_budget_bytes if request.kda_page_bytes else 0
        tier = HostTier(
            request.kv_page_bytes,
            request.kda_page_bytes,
            self.kv_budget_bytes,
            kda_budget,
            request.layout_fingerprint,
            pin=self.pin,
            lease_ttl_s=self.lease_ttl_s,
            page_memory=self._shared_memory if self.shm_dir else None,
            tenant_reserve_pages=self.tenant_reserve_pages,
        )
        self.backend.register(BLOCKS, tier.arena(KV).storage)
        if tier.kda is not None:
            self.backend.register(STATE, tier.arena(KDA).storage)
        self._endpoint = endpoint_to_pb(self.backend.endpoint())
        self.tier = tier
        self.on_tier(tier)

    def _shared_memory(self, kind: str, num_pages: int, page_bytes: int) -> torch.Tensor:
        """An arena's storage in a new shared-memory file; private memory (pinned as ``pin`` says) when
        ``shm_dir`` cannot hold it, logged. Not page-locked here: the workers that map it lock their
        mappings, and NIXL registers it for the others."""
        if not self.shared:
            remove_orphans(self.shm_dir, self.tier_id)  # files a dead tier process left
        try:
            pages = create_pages(self.shm_dir, self.tier_id, kind, num_pages, page_bytes)
        except (ValueError, OSError) as error:
            log.warning("%s: keeping the %s pages private, reached over NIXL only", error, kind)
            pin = self.pin if self.pin is not None else torch.cuda.is_available()
            return torch.empty(num_pages, page_bytes, dtype=torch.uint8, pin_memory=pin)
        self.shared[kind] = pages
        return map_pages(pages)

    def close(self) -> None:
        """Remove the arenas' shared-memory files (workers' mappings stay valid until they drop them)."""
        for pages in self.shared.values():
            remove_pages(pages)

    def _check_same_layout(self, request) -> None:
        tier = self.tier
        if request.layout_fingerprint != tier.layout_fingerprint:
            raise ValueError(
                f"layout_fingerprint: {request.layout_fingerprint!r} is not this tier's "
                f"{tier.layout_fingerprint!r} (its first worker's); a tier serves one model layout"
            )
        kda_page_bytes = tier.kda.page_bytes if tier.kda is not None else 0
        for field, asked, held in (
            ("kv_page_bytes", request.kv_page_bytes, tier.kv.page_bytes),
            ("kda_page_bytes", request.kda_page_bytes, kda_page_bytes),
        ):
            if asked != held:
                raise ValueError(f"{field}: {asked} is not this tier's {held} (its first worker's)")

    def _attached(self, context: grpc.ServicerContext) -> HostTier:
        tier = self.tier
        if tier is None:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, "no worker has attached yet: call Attach first"
            )
        return tier


def _shared_pb(pages: SharedPages | None) -> host_cache_pb2.SharedPages | None:
    if pages is None:
        return None
    return host_cache_pb2.SharedPages(
        node_id=pages.node_id, path=pages.path, num_pages=pages.num_pages, page_bytes=pages.page_bytes
    )


def _hashes(hashes: Sequence[bytes]) -> list[bytes]:
    for index, block_hash in enumerate(hashes):
        if len(block_hash) != HASH_BYTES:
            raise ValueError(
                f"hashes: entry {index} is {len(block_hash)} bytes; a block hash is {HASH_BYTES} (SHA-256)"
            )
    return list(hashes)
