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
the request's salted hash chain. With the tier in this process (``HostTier``) the rows move with
torch copies between the arenas' storage and the pools; a tier in another process (``baton cache``)
would move them over the worker's transfer backend, which is not wired yet (``EngineConfig`` refuses
``--host-cache-address`` until it is).

A page whose checksum fails is dropped by the tier's ``begin_get``: the lease comes back short, the
cache manager falls back to the device pool's own hit and the request recomputes the rest.
"""

from collections import Counter, OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from services.engine.cache.block_pool import BlockPool
from services.engine.cache.state_pool import StateSlotPool
from services.hicache.host_tier import KDA, KV, HostTier, TierMatch

GIB = 1 << 30


@dataclass(frozen=True)
class HostLeases:
    """Pages leased (checksums verified) for one admission: ``kv_pages`` for the blocks asked for, in
    order (fewer when one was missing or corrupt), ``kda_page`` the snapshot at their end (None: not
    held, or a model without KDA state)."""

    kv_lease: int
    kv_pages: tuple[int, ...]
    kda_lease: int | None
    kda_page: int | None
    snapshot_hash: bytes


class HostCacheConnector:
    """Moves a request's prefix between the device pools and an in-process ``HostTier``.

    Args:
        tier: the host tier (its arenas' page sizes must be the pools' row sizes).
        blocks: the device block pool.
        slots: the device KDA state-slot pool (a model without KDA layers has an empty layout).

    Raises:
        ValueError: page sizes that are not the pools' row sizes, naming the field.
    """

    def __init__(self, tier: HostTier, blocks: BlockPool, slots: StateSlotPool):
        self.has_state = bool(slots.layout.fields)
        if tier.kv.page_bytes != blocks.layout.nbytes:
            raise ValueError(
                f"kv_page_bytes: the tier's {tier.kv.page_bytes} bytes are not one packed block "
                f"({blocks.layout.nbytes} bytes)"
            )
        if self.has_state and (tier.kda is None or tier.kda.page_bytes != slots.layout.nbytes):
            raise ValueError(
                f"kda_page_bytes: the tier's KDA pages are not one state slot ({slots.layout.nbytes})"
            )
        self.tier = tier
        self.blocks = blocks
        self.slots = slots
        # Snapshot read-back accounting (docs/hicache.md, "Snapshot placement"): the reason each
        # snapshot was written to the tier, and how many of each reason were saved and restored.
        self._snapshot_reason: OrderedDict[bytes, str] = OrderedDict()  # at most the tier's KDA pages
        self.snapshots_saved: Counter[str] = Counter()
        self.snapshots_restored: Counter[str] = Counter()
        self.offloaded_blocks = 0

    @classmethod
    def in_process(
        cls, blocks: BlockPool, slots: StateSlotPool, gib: float, kda_fraction: float
    ) -> "HostCacheConnector":
        """A tier of ``gib`` GiB owned by this engine: ``kda_fraction`` of it for KDA snapshots (all of
        it for KV blocks on a model without KDA layers).

        Raises:
            ValueError: a budget too small for one page of a kind, naming ``host_cache_gib``.
        """
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
        fingerprint = f"{blocks.layout.fingerprint()}|{slots.layout.fingerprint()}"
        tier = HostTier(
            blocks.layout.nbytes,
            slots.layout.nbytes if has_state else 0,
            kv_budget,
            kda_budget,
            fingerprint,
        )
        return cls(tier, blocks, slots)

    def match(self, hashes: Sequence[bytes]) -> TierMatch:
        """What the tier holds of ``hashes``; ``usable_depth``: the leading blocks it can restore a
        request to (the hybrid rule: up to its deepest KDA snapshot within its KV depth; the KV depth
        without KDA state)."""
        return self.tier.match(hashes, self.has_state)

    def lease(self, hashes: Sequence[bytes], first: int) -> HostLeases:
        """Lease the pages of ``hashes[first:]`` and the KDA snapshot under ``hashes[-1]`` (checksums
        verified by the tier); pages stay put until ``release``. ``complete`` says whether all came."""
        kv = self.tier.begin_get(KV, list(hashes[first:]))
        kda = self.tier.begin_get(KDA, [hashes[-1]]) if self.has_state else None
        return HostLeases(
            kv.lease_id,
            kv.pages,
            kda.lease_id if kda is not None else None,
            kda.pages[0] if kda is not None and kda.pages else None,
            hashes[-1],
        )

    def complete(self, leases: HostLeases, num_blocks: int) -> bool:
        """Whether ``leases`` hold all ``num_blocks`` blocks and, with KDA state, the snapshot (a
        request restored from the tier needs the state at the end of exactly those blocks)."""
        return len(leases.kv_pages) == num_blocks and (not self.has_state or leases.kda_page is not None)

    def copy_in(self, leases: HostLeases, block_ids: Sequence[int], slot: int) -> None:
        """Copy the leased pages into ``block_ids`` (one each) and the snapshot into ``slot``."""
        if len(leases.kv_pages) != len(block_ids):
            raise ValueError(f"block_ids: {len(block_ids)} given for {len(leases.kv_pages)} leased pages")
        if block_ids:  # one gather and one scatter, not a copy per block
            rows = self.tier.kv.storage[list(leases.kv_pages)]
            self.blocks.storage[list(block_ids)] = rows.to(self.blocks.storage.device)
        if leases.kda_page is not None:
            self.slots.storage[slot].copy_(self.tier.kda.storage[leases.kda_page])
            self.snapshots_restored[self._snapshot_reason.get(leases.snapshot_hash, "unknown")] += 1

    def release(self, leases: HostLeases) -> None:
        """End the leases: the pages may be evicted again."""
        self.tier.end_get(leases.kv_lease)
        if leases.kda_lease is not None:
            self.tier.end_get(leases.kda_lease)

    def save_blocks(self, hashes: Sequence[bytes], block_ids: Sequence[int]) -> None:
        """Write-through: copy the device blocks ``block_ids`` (holding ``hashes``) into the tier; blocks
        it already holds (or has no free page for) are skipped."""
        if not hashes:
            return
        lease = self.tier.reserve_put(KV, list(hashes))
        kept = [(page, block) for page, block in zip(lease.pages, block_ids, strict=True) if page is not None]
        with self._putting(lease.lease_id):
            if kept:
                pages, blocks = zip(*kept, strict=True)
                self.tier.kv.storage[list(pages)] = self.blocks.storage[list(blocks)].cpu()

    def save_state(self, block_hash: bytes, state_row: torch.Tensor, reason: str) -> None:
        """Write-through of a KDA snapshot: ``state_row`` (a slot's bytes) is the state after the block
        ``block_hash``; ``reason`` (``services/engine/cache/snapshot_policy.py``) is kept for the
        read-back accounting."""
        if not self.has_state:
            return
        lease = self.tier.reserve_put(KDA, [block_hash])
        (page,) = lease.pages
        if page is None:
            self.tier.commit_put(lease.lease_id)
            return
        with self._putting(lease.lease_id):
            self.tier.kda.storage[page].copy_(state_row)
            self._snapshot_reason[block_hash] = reason
            self._snapshot_reason.move_to_end(block_hash)
            if len(self._snapshot_reason) > self.tier.kda.num_pages:
                self._snapshot_reason.popitem(last=False)
            self.snapshots_saved[reason] += 1

    def offload(self, block: int, block_hash: bytes) -> None:
        """A cached device block is about to be reused: keep its bytes in the tier unless it holds them."""
        lease = self.tier.reserve_put(KV, [block_hash])
        (page,) = lease.pages
        with self._putting(lease.lease_id):
            if page is not None:
                self.tier.kv.storage[page].copy_(self.blocks.storage[block])
                self.offloaded_blocks += 1

    @contextmanager
    def _putting(self, lease_id: int) -> Iterator[None]:
        """Write a put's pages inside: committed after, aborted if the writing raised."""
        try:
            yield
        except BaseException:
            self.tier.abort_put(lease_id)
            raise
        self.tier.commit_put(lease_id)

    def check_integrity(self) -> None:
        """The tier's arenas are consistent and no lease is left open."""
        self.tier.check_integrity()
        assert self.tier.open_leases() == 0, f"{self.tier.open_leases()} host-tier leases left open"
