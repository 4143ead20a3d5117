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
``baton cache`` service for ``remote``) and moving the rows (``host_rows.py``: torch copies, or this
engine's NIXL agent reading and writing the service's regions).

A page whose checksum fails is dropped by the tier's ``begin_get``: the lease comes back short, the
cache manager falls back to the device pool's own hit and the request recomputes the rest. A row
move that fails (a remote tier died or restarted mid-way) is the same miss: ``copy_in`` answers
False, a save is aborted; no request fails.
"""

import logging
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from services.engine.cache.block_pool import BlockPool
from services.engine.cache.state_pool import StateSlotPool
from services.hicache.host_tier import KDA, KV, HostTier, TierMatch
from services.hicache.port import HostTierPort

from .host_rows import LocalRows, RemoteRows

if TYPE_CHECKING:  # the client imports services.rpc, which imports the engine
    from services.hicache.client import HostCacheClient

log = logging.getLogger(__name__)
GIB = 1 << 30
REMOTE_REASONS_KEPT = 1 << 16  # snapshot reasons remembered when the tier's KDA page count is unknown


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
    """Moves a request's prefix between the device pools and a host tier.

    Args:
        tier: the tier's index and leases (``HostTier`` in this process, ``HostCacheClient`` remote).
        rows: what moves the rows (``LocalRows`` / ``RemoteRows`` of the same tier).
        blocks: the device block pool.
        slots: the device KDA state-slot pool (a model without KDA layers has an empty layout).
        reasons_kept: how many snapshots' save reasons to remember (the tier's KDA page count).
    """

    def __init__(
        self,
        tier: HostTierPort,
        rows: LocalRows | RemoteRows,
        blocks: BlockPool,
        slots: StateSlotPool,
        reasons_kept: int,
    ):
        self.has_state = bool(slots.layout.fields)
        self.tier = tier
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
        tier = HostTier(
            blocks.layout.nbytes,
            slots.layout.nbytes if has_state else 0,
            kv_budget,
            kda_budget,
            layout_fingerprint(blocks, slots),
        )
        kda_pages = tier.kda.num_pages if tier.kda is not None else 0
        return cls(tier, LocalRows(tier, blocks, slots), blocks, slots, kda_pages)

    @classmethod
    def remote(
        cls, address: str, blocks: BlockPool, slots: StateSlotPool, client: "HostCacheClient | None" = None
    ) -> "HostCacheConnector | None":
        """The ``baton cache`` service at ``address`` (``HOST:PORT``), attached with the pools' layout
        fingerprint and row sizes; a tier not reachable yet is attached to when it is (misses till
        then). ``client``: one already made for ``address`` (tests pass theirs).

        None when the tier refuses this engine (another model's or KV format's layout, other page
        sizes): the engine serves without a tier, and the error is logged naming
        ``host_cache_address`` and the tier's field.
        """
        if client is None:
            from services.hicache.client import HostCacheClient  # here: it imports the engine

            client = HostCacheClient(address)
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
        return cls(client, RemoteRows(client, blocks, slots), blocks, slots, kept)

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
        self.open_leases += 1 + (kda is not None)
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

    def copy_in(self, leases: HostLeases, block_ids: Sequence[int], slot: int) -> bool:
        """Copy the leased pages into ``block_ids`` (one each) and the snapshot into ``slot``; False
        when the rows could not be moved (the blocks and slot then hold nothing usable: a miss)."""
        if len(leases.kv_pages) != len(block_ids):
            raise ValueError(f"block_ids: {len(block_ids)} given for {len(leases.kv_pages)} leased pages")
        if not self.rows.read(leases.kv_pages, block_ids, leases.kda_page, slot):
            return False
        if leases.kda_page is not None:
            self.snapshots_restored[self._snapshot_reason.get(leases.snapshot_hash, "unknown")] += 1
        return True

    def release(self, leases: HostLeases) -> None:
        """End the leases: the pages may be evicted again."""
        self.tier.end_get(leases.kv_lease)
        self.open_leases -= 1
        if leases.kda_lease is not None:
            self.tier.end_get(leases.kda_lease)
            self.open_leases -= 1

    def save_blocks(self, hashes: Sequence[bytes], block_ids: Sequence[int]) -> None:
        """Write-through: copy the device blocks ``block_ids`` (holding ``hashes``) into the tier; blocks
        it already holds (or has no free page for) are skipped."""
        if not hashes:
            return
        lease = self.tier.reserve_put(KV, list(hashes))
        kept = [(page, block) for page, block in zip(lease.pages, block_ids, strict=True) if page is not None]
        pages, blocks = zip(*kept, strict=True) if kept else ((), ())
        self._put(lease.lease_id, lambda: self.rows.write_blocks(pages, blocks))

    def save_state(self, block_hash: bytes, state_row: torch.Tensor, reason: str) -> None:
        """Write-through of a KDA snapshot: ``state_row`` (a slot's bytes) is the state after the block
        ``block_hash``; ``reason`` (``services/engine/cache/snapshot_policy.py``) is kept for the
        read-back accounting."""
        if not self.has_state:
            return
        lease = self.tier.reserve_put(KDA, [block_hash])
        (page,) = lease.pages
        moved = self._put(lease.lease_id, lambda: page is None or self.rows.write_state(page, state_row))
        if page is None or not moved:
            return
        self._snapshot_reason[block_hash] = reason
        self._snapshot_reason.move_to_end(block_hash)
        if len(self._snapshot_reason) > self._reasons_kept:
            self._snapshot_reason.popitem(last=False)
        self.snapshots_saved[reason] += 1

    def offload(self, block: int, block_hash: bytes) -> None:
        """A cached device block is about to be reused: keep its bytes in the tier unless it holds them."""
        lease = self.tier.reserve_put(KV, [block_hash])
        (page,) = lease.pages
        moved = self._put(lease.lease_id, lambda: page is None or self.rows.write_blocks([page], [block]))
        if page is not None and moved:
            self.offloaded_blocks += 1

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
