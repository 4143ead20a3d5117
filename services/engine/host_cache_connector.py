"""The engine's side of the HiCache host tier: match, load, save (``docs/hicache.md``).

The cache manager drives it at four points of a request's life (vLLM's KV-connector split, in one
process)::

    find_prefix   match(hashes)            how far the tier extends the device pool's prefix hit
    admit         lease / copy / release   lease (and verify) the pages, then copy them into fresh
                                           blocks and the request's slot
    progress/end  save_blocks/save_state   write-through of the blocks and snapshots just registered
    eviction      offload(block, hash)     a cached device block about to be reused, if the tier
                                           does not hold it yet

Pages hold the device pool's rows byte for byte (a packed block, a whole KDA state slot), keyed by
the request's salted hash chain. Two concerns are kept apart: the tier's bookkeeping (a
``HostTierPort``: the in-process ``HostTier`` of ``in_process``, or the ``HostCacheClient`` of a
``baton cache`` service for ``remote``) and moving the rows (``host_rows.py``: torch copies, of the
service's shared-memory pages when it runs on this machine, or this engine's NIXL agent reading and writing
the service's regions).

With a Redis L3 below the tier (``services/hicache/tier_l3.py``: this engine's own ``TierL3``, or the
``baton cache`` service's), ``start_prefetch`` asks the tier to bring a request's chain from the L3
into its pages while the request queues; the scheduler's ``PrefetchGate`` decides how long it waits.

A page whose checksum fails is dropped by the tier's ``begin_get``: the lease comes back short, the
cache manager falls back to the device pool's own hit and the request recomputes the rest. A row
move that fails (a remote tier died or restarted mid-way) is the same miss: ``copy_in`` answers
False, a save is aborted; no request fails.

What happens is counted in ``counters`` (``cache_counters.py``: bytes each way, offloads, saves
skipped for lack of room, loads that fell back and why); the tier's own hits and misses are counted
once per admitted request (``record_lookup``), not per ``match``.
"""

import logging
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import torch

from common.internal_tls import InternalTls
from services.engine.cache.block_pool import BlockPool
from services.engine.cache.state_pool import StateSlotPool
from services.hicache.host_tier import KDA, KV, HostTier, TierMatch
from services.hicache.port import HostTierPort, PrefetchHandle, PrefetchPort
from services.hicache.redis_l3 import RedisL3
from services.hicache.tier_l3 import TierL3

from .cache_counters import CHECKSUM, MOVE_FAILED, SHORT_LEASE, TO_DEVICE, TO_HOST, CacheCounters, CacheCounts
from .host_rows import LocalRows, RemoteRows, SharedRows

if TYPE_CHECKING:  # the client imports services.rpc, which imports the engine
    from services.hicache.client import HostCacheClient

log = logging.getLogger(__name__)
GIB = 1 << 30
REMOTE_REASONS_KEPT = 1 << 16  # snapshot reasons remembered when the tier's KDA page count is unknown


@dataclass(frozen=True)
class HostLeases:
    """Pages leased (checksums verified) for one admission: ``kv_pages`` for the blocks asked for, in
    order (fewer when one was missing or corrupt), ``kda_page`` the snapshot at their end (None: not
    held; ``kda_lease`` None too: not asked for, or a model without KDA state); ``checksum_failures``:
    pages the tier dropped as corrupt."""

    kv_lease: int
    kv_pages: tuple[int, ...]
    kda_lease: int | None
    kda_page: int | None
    snapshot_hash: bytes
    checksum_failures: int = 0


class HostCacheConnector:
    """Moves a request's prefix between the device pools and a host tier.

    Args:
        tier: the tier's index and leases (``HostTier`` in this process, ``HostCacheClient`` remote).
        rows: what moves the rows (``LocalRows`` / ``RemoteRows`` of the same tier).
        blocks: the device block pool.
        slots: the device KDA state-slot pool (a model without KDA layers has an empty layout).
        reasons_kept: how many snapshots' save reasons to remember (the tier's KDA page count).
        prefetcher: what starts a prefetch from the tier's L3 (None: the tier has none).
    """

    def __init__(
        self,
        tier: HostTierPort,
        rows: LocalRows | RemoteRows,
        blocks: BlockPool,
        slots: StateSlotPool,
        reasons_kept: int,
        prefetcher: PrefetchPort | None = None,
    ):
        self.has_state = bool(slots.layout.fields)
        self.tier = tier
        self.prefetcher = prefetcher
        self.rows = rows
        self.blocks = blocks
        self.slots = slots
        self.open_leases = 0  # get leases this connector began and has not ended
        # Snapshot read-back accounting (docs/hicache.md, "Snapshot placement"): the reason each
        # snapshot was written to the tier, and how many of each reason were saved and restored.
        self._reasons_kept = reasons_kept
        self._snapshot_reason: OrderedDict[bytes, str] = OrderedDict()
        self.snapshots_saved: Counter[str] = Counter()
        self.snapshots_restored: Counter[str] = Counter()
        self.counters = CacheCounters()

    @classmethod
    def in_process(
        cls,
        blocks: BlockPool,
        slots: StateSlotPool,
        gib: float,
        kda_fraction: float,
        redis_url: str = "",
        l3_gib: float = 0.0,
        tenant_reserve_pages: int = 0,
        snapshot_stride: int = 1,
    ) -> "HostCacheConnector":
        """A tier of ``gib`` GiB owned by this engine: ``kda_fraction`` of it for KDA snapshots (all of
        it for KV blocks on a model without KDA layers); with ``l3_gib`` > 0, a Redis L3 of that size
        at ``redis_url`` below it; ``tenant_reserve_pages`` KV pages each tenant keeps against other
        tenants' puts, and one snapshot per ``snapshot_stride`` of them (``HostTier``).

        Raises:
            ValueError: a budget too small for one page of a kind, naming ``host_cache_gib``; an L3
                without a URL, naming ``redis_l3_gib``.
        """
        if l3_gib > 0 and not redis_url:
            raise ValueError("redis_l3_gib: the L3 lives in Redis: give the worker --redis-url, or set 0")
        total = int(gib * GIB)
        has_state = bool(slots.layout.fields)
        kda_budget = int(total * kda_fraction) if has_state else 0
        kv_budget = total - kda_budget
        needed = blocks.layout.nbytes + (slots.layout.nbytes if has_state else 0)
        if kv_budget < blocks.layout.nbytes or (has_state and kda_budget < slots.layout.nbytes):
            raise ValueError(
                f"host_cache_gib: {gib} GiB (KDA share {kda_fraction}) holds no page of a kind; one KV "
                f"block and one KDA snapshot need {needed} bytes together: raise it or set 0 (no tier)"
            )
        tier = HostTier(
            blocks.layout.nbytes,
            slots.layout.nbytes if has_state else 0,
            kv_budget,
            kda_budget,
            layout_fingerprint(blocks, slots),
            tenant_reserve_pages=tenant_reserve_pages,
            snapshot_stride=snapshot_stride,
        )
        kda_pages = tier.kda.num_pages if tier.kda is not None else 0
        l3 = None
        if l3_gib > 0:
            l3 = TierL3(tier, RedisL3(redis_url, int(l3_gib * GIB), tier.layout_fingerprint))
        return cls(tier, LocalRows(tier, blocks, slots), blocks, slots, kda_pages, prefetcher=l3)

    @classmethod
    def remote(
        cls,
        address: str,
        blocks: BlockPool,
        slots: StateSlotPool,
        client: "HostCacheClient | None" = None,
        cluster_secret: str = "",
        internal_tls: InternalTls | None = None,
    ) -> "HostCacheConnector | None":
        """The ``baton cache`` service at ``address`` (``HOST:PORT``), attached with the pools' layout
        fingerprint and row sizes; a tier not reachable yet is attached to when it is (misses till
        then). ``client``: one already made for ``address`` (tests pass theirs); ``cluster_secret``:
        sent on every call to the tier (``--cluster-secret-file``; "": none); ``internal_tls``: the
        cluster's internal mutual TLS to the tier (``common/internal_tls.py``; None: plaintext).

        None when the tier refuses this engine (another model's or KV format's layout, other page
        sizes): the engine serves without a tier, and the error is logged naming
        ``host_cache_address`` and the tier's field.
        """
        if client is None:
            from services.hicache.client import HostCacheClient  # here: it imports the engine

            client = HostCacheClient(address, cluster_secret=cluster_secret, internal_tls=internal_tls)
        has_state = bool(slots.layout.fields)
        try:
            client.attach(
                layout_fingerprint(blocks, slots),
                blocks.layout.nbytes,
                slots.layout.nbytes if has_state else 0,
            )
        except ValueError as error:
            log.error(
                "host_cache_address: %r: the tier refused this engine (%s): serving without the tier",
                address,
                error,
            )
            client.close()
            return None
        kda = client.stats().get(KDA)
        kept = kda.pages_total if kda is not None else REMOTE_REASONS_KEPT
        rows = SharedRows(client, RemoteRows(client, blocks, slots))
        return cls(client, rows, blocks, slots, kept, prefetcher=client)

    def match(self, hashes: Sequence[bytes]) -> TierMatch:
        """What the tier holds of ``hashes``; ``usable_depth``: the leading blocks it can restore a
        request to (the hybrid rule: up to its deepest KDA snapshot within its KV depth; the KV depth
        without KDA state)."""
        return self.tier.match(hashes, self.has_state)

    def start_prefetch(self, hashes: Sequence[bytes], tenant: str = "") -> PrefetchHandle | None:
        """Ask the tier to bring what it lacks of ``hashes`` from its L3 (as ``tenant``'s pages), without
        waiting; None when the tier has no L3 or there is nothing to ask."""
        if self.prefetcher is None or not hashes:
            return None
        return self.prefetcher.prefetch(list(hashes), self.has_state, tenant)

    def record_lookup(self, match: TierMatch, num_hashes: int, with_state: bool = True) -> None:
        """Count an admitted request's ``match`` of its ``num_hashes``-block chain in the tier's hits and
        misses (once per admission: a waiting request is matched on every scheduler pass). Without
        ``with_state`` (a reservation: the handoff brings the KDA state) no KDA lookup is counted."""
        counted = self.has_state and with_state
        kda_hit = int(match.usable_depth > 0) if counted else 0
        kda_miss = int(counted and not kda_hit)
        self.tier.record_lookup(match.kv_depth, num_hashes - match.kv_depth, kda_hit, kda_miss)

    def lease(self, hashes: Sequence[bytes], first: int, with_state: bool = True) -> HostLeases:
        """Lease the pages of ``hashes[first:]`` and (``with_state``, a model with KDA state) the KDA
        snapshot under ``hashes[-1]`` (checksums verified by the tier); pages stay put until
        ``release``. ``complete`` says whether all came."""
        kv = self.tier.begin_get(KV, list(hashes[first:]))
        kda = self.tier.begin_get(KDA, [hashes[-1]]) if self.has_state and with_state else None
        self.open_leases += 1 + (kda is not None)
        return HostLeases(
            kv.lease_id,
            kv.pages,
            kda.lease_id if kda is not None else None,
            kda.pages[0] if kda is not None and kda.pages else None,
            hashes[-1],
            kv.checksum_failures + (kda.checksum_failures if kda is not None else 0),
        )

    def complete(self, leases: HostLeases, num_blocks: int) -> bool:
        """Whether ``leases`` hold all ``num_blocks`` blocks and the snapshot, if one was leased for (a
        request restored from the tier needs the state at the end of exactly those blocks)."""
        state_came = leases.kda_lease is None or leases.kda_page is not None
        return len(leases.kv_pages) == num_blocks and state_came

    def fell_back(self, leases: HostLeases) -> None:
        """Count a load given up because ``leases`` were not ``complete`` (a page corrupt, or gone)."""
        self.counters.load_fallbacks[CHECKSUM if leases.checksum_failures else SHORT_LEASE] += 1

    def copy_in(self, leases: HostLeases, block_ids: Sequence[int], slot: int) -> bool:
        """Copy the leased pages into ``block_ids`` (one each) and the snapshot into ``slot``; False
        when the rows could not be moved (the blocks and slot then hold nothing usable: a miss)."""
        if len(leases.kv_pages) != len(block_ids):
            raise ValueError(f"block_ids: {len(block_ids)} given for {len(leases.kv_pages)} leased pages")
        if not self.rows.read(leases.kv_pages, block_ids, leases.kda_page, slot):
            self.counters.load_fallbacks[MOVE_FAILED] += 1
            return False
        self.counters.moved(KV, TO_DEVICE, len(block_ids) * self.blocks.layout.nbytes)
        if leases.kda_page is not None:
            self.counters.moved(KDA, TO_DEVICE, self.slots.layout.nbytes)
            self.snapshots_restored[self._snapshot_reason.get(leases.snapshot_hash, "unknown")] += 1
        return True

    def release(self, leases: HostLeases) -> None:
        """End the leases: the pages may be evicted again."""
        self.tier.end_get(leases.kv_lease)
        self.open_leases -= 1
        if leases.kda_lease is not None:
            self.tier.end_get(leases.kda_lease)
            self.open_leases -= 1

    def save_blocks(self, hashes: Sequence[bytes], block_ids: Sequence[int], tenant: str = "") -> None:
        """Write-through: copy the device blocks ``block_ids`` (holding ``hashes``) into the tier as
        ``tenant``'s pages; blocks it already holds (or has no page for) are skipped."""
        if not hashes:
            return
        lease = self.tier.reserve_put(KV, list(hashes), tenant)
        self.counters.saves_skipped[KV] += lease.no_room
        kept = [(page, block) for page, block in zip(lease.pages, block_ids, strict=True) if page is not None]
        pages, blocks = zip(*kept, strict=True) if kept else ((), ())
        if self._put(lease.lease_id, lambda: self.rows.write_blocks(pages, blocks)):
            self.counters.moved(KV, TO_HOST, len(pages) * self.blocks.layout.nbytes)

    def save_state(self, block_hash: bytes, state_row: torch.Tensor, reason: str, tenant: str = "") -> None:
        """Write-through of a KDA snapshot, as ``tenant``'s page: ``state_row`` (a slot's bytes) is the
        state after the block ``block_hash``; ``reason`` (``services/engine/cache/snapshot_policy.py``) is
        kept for the read-back accounting."""
        if not self.has_state:
            return
        lease = self.tier.reserve_put(KDA, [block_hash], tenant)
        self.counters.saves_skipped[KDA] += lease.no_room
        (page,) = lease.pages
        moved = self._put(lease.lease_id, lambda: page is None or self.rows.write_state(page, state_row))
        if page is None or not moved:
            return
        self.counters.moved(KDA, TO_HOST, self.slots.layout.nbytes)
        self._snapshot_reason[block_hash] = reason
        self._snapshot_reason.move_to_end(block_hash)
        if len(self._snapshot_reason) > self._reasons_kept:
            self._snapshot_reason.popitem(last=False)
        self.snapshots_saved[reason] += 1

    def offload(self, blocks: Sequence[int], hashes: Sequence[bytes], tenants: Sequence[str]) -> None:
        """Cached device blocks (``blocks``, holding ``hashes``, of ``tenants``) are about to be reused:
        keep the bytes of those the tier lacks, in one put per tenant among them (one reservation and
        one move each; usually one for the whole batch), so each page counts in its tenant's reserve."""
        for tenant in dict.fromkeys(tenants):
            mine = [i for i, owner in enumerate(tenants) if owner == tenant]
            lease = self.tier.reserve_put(KV, [hashes[i] for i in mine], tenant)
            self.counters.saves_skipped[KV] += lease.no_room
            pairs = zip(lease.pages, (blocks[i] for i in mine), strict=True)
            kept = [(page, block) for page, block in pairs if page is not None]
            pages, kept_blocks = zip(*kept, strict=True) if kept else ((), ())
            if self._put(lease.lease_id, partial(self.rows.write_blocks, pages, kept_blocks)) and pages:
                self.counters.offloads += len(pages)
                self.counters.moved(KV, TO_HOST, len(pages) * self.blocks.layout.nbytes)

    def counts(self) -> CacheCounts:
        """The counters' totals, with the tier's reachability: an in-process tier is always up (and its
        stats come along: no ``baton cache`` exports them); a ``baton cache`` is up while its client's
        last call reached it."""
        if isinstance(self.tier, HostTier):
            return self.counters.counts(tier_up=True, host_tier=self.tier.stats())
        return self.counters.counts(tier_up=self.tier.available, tier_reconnects=self.tier.reconnects)

    def _put(self, lease_id: int, write: Callable[[], bool]) -> bool:
        """Finish a put: ``write`` its pages (whether they were written, True with none to write), then
        commit it; abort it instead when a move failed or the writing raised. Returns what ``write`` said."""
        try:
            moved = write()
        except BaseException:
            self.tier.abort_put(lease_id)
            raise
        (self.tier.commit_put if moved else self.tier.abort_put)(lease_id)
        return moved

    def check_integrity(self) -> None:
        """No get lease this connector began is left open (puts end inside the call that reserved them);
        an in-process tier's arenas are consistent with none open."""
        assert self.open_leases == 0, f"{self.open_leases} host-tier leases left open by the connector"
        self.rows.check_integrity()


def layout_fingerprint(blocks: BlockPool, slots: StateSlotPool) -> str:
    """What a tier's pages must have been written with: the pools' block and slot layouts."""
    return f"{blocks.layout.fingerprint()}|{slots.layout.fingerprint()}"
