"""Moving rows between the device pools and the host tier's pages: the ``HostRows`` of
``HostCacheConnector`` (``host_cache_connector.py``), one per place the tier lives.

- ``LocalRows``: an in-process ``HostTier``; torch copies between its arenas' storage and the pools.
- ``SharedRows``: a ``baton cache`` service on this machine whose arenas are shared-memory files: mapped
  here and copied with torch like ``LocalRows``; ``RemoteRows`` when they cannot be mapped.
- ``RemoteRows``: a ``baton cache`` service; this engine's own NIXL agent with the pools registered
  (``"blocks"``, ``"state"``, the tier's region names) reads and writes the tier's pages one-sidedly.
  A snapshot row lives in the device snapshot store, not in a registered region: it is copied into a
  one-slot ``"staging"`` region first, then written into the tier's ``"state"`` page.

Each move answers whether it happened: ``False`` (a transfer error: the tier died or restarted) makes
the connector treat it as a miss -- a load falls back like a corrupt page, a save is aborted.
"""

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from common.errors import TransferError
from services.engine.cache.block_pool import BlockPool
from services.engine.cache.state_pool import StateSlotPool
from services.hicache.host_tier import KDA, KV, HostTier
from services.hicache.shared_pages import map_pages, node_id
from services.hicache.shared_pages import pin as pin_pages
from services.hicache.shared_pages import unpin as unpin_pages
from services.transfer import BLOCKS, STATE, TransferBackend, make_backend
from services.transfer.byte_plan import ByteSpan

if TYPE_CHECKING:  # the client imports services.rpc, which imports the engine
    from services.hicache.client import HostCacheClient

log = logging.getLogger(__name__)

STAGING = "staging"  # RemoteRows' one-slot region a snapshot row is written from


def copy_rows(dst: torch.Tensor, dst_rows: Sequence[int], src: torch.Tensor, src_rows: Sequence[int]) -> None:
    """``dst[dst_rows[i]] = src[src_rows[i]]`` for every ``i``, one copy per run of rows consecutive on
    both sides (a device <-> pinned host copy is then one DMA per run, issued without waiting; byte-row
    indexing would move the rows one byte at a time: 0.03x a plain copy on the CPU box, 0.75x this way).
    """
    if len(dst_rows) != len(src_rows):
        raise ValueError(f"dst_rows: {len(dst_rows)} rows for {len(src_rows)} source rows")
    start = 0
    for index in range(1, len(src_rows) + 1):
        run_ends = (
            index == len(src_rows)
            or src_rows[index] != src_rows[index - 1] + 1
            or dst_rows[index] != dst_rows[index - 1] + 1
        )
        if run_ends:
            count = index - start
            first_dst, first_src = dst_rows[start], src_rows[start]
            dst[first_dst : first_dst + count].copy_(src[first_src : first_src + count], non_blocking=True)
            start = index


def _wait_for_copies(device_storage: torch.Tensor) -> None:
    """Wait for the copies ``copy_rows`` issued without waiting on ``device_storage``'s device."""
    if device_storage.is_cuda:
        torch.cuda.current_stream(device_storage.device).synchronize()


class PageCopies:
    """Torch copies between host page storages this process holds or maps (``kv``: one packed block per
    row, ``kda``: one state slot per row, or ``None``) and the device pools."""

    def __init__(self, kv: torch.Tensor, kda: torch.Tensor | None, blocks: BlockPool, slots: StateSlotPool):
        self.kv = kv
        self.kda = kda
        self.blocks = blocks
        self.slots = slots

    def read(
        self, kv_pages: Sequence[int], block_ids: Sequence[int], kda_page: int | None, slot: int
    ) -> bool:
        """Copy ``kv_pages`` into ``block_ids`` (one each) and ``kda_page`` (if any) into ``slot``."""
        copy_rows(self.blocks.storage, block_ids, self.kv, kv_pages)
        if kda_page is not None:
            self.slots.storage[slot].copy_(self.kda[kda_page], non_blocking=True)
        _wait_for_copies(self.blocks.storage)  # the pages may be evicted once the lease ends
        return True

    def write_blocks(self, pages: Sequence[int], block_ids: Sequence[int]) -> bool:
        """Copy the device blocks ``block_ids`` into ``pages`` (one each)."""
        if not pages:
            return True
        copy_rows(self.kv, pages, self.blocks.storage, block_ids)
        _wait_for_copies(self.blocks.storage)  # the put's commit checksums the pages next
        return True

    def write_state(self, page: int, state_row: torch.Tensor) -> bool:
        """Copy ``state_row`` (one slot's bytes) into the KDA page ``page``."""
        self.kda[page].copy_(state_row)
        return True


class LocalRows(PageCopies):
    """Rows of an in-process ``HostTier``'s arenas, copied with torch.

    Raises:
        ValueError: page sizes that are not the pools' row sizes, naming the field.
    """

    def __init__(self, tier: HostTier, blocks: BlockPool, slots: StateSlotPool):
        if tier.kv.page_bytes != blocks.layout.nbytes:
            raise ValueError(
                f"kv_page_bytes: the tier's {tier.kv.page_bytes} bytes are not one packed block "
                f"({blocks.layout.nbytes} bytes)"
            )
        if slots.layout.fields and (tier.kda is None or tier.kda.page_bytes != slots.layout.nbytes):
            raise ValueError(
                f"kda_page_bytes: the tier's KDA pages are not one state slot ({slots.layout.nbytes})"
            )
        super().__init__(tier.kv.storage, tier.kda.storage if tier.kda is not None else None, blocks, slots)
        self.tier = tier

    def check_integrity(self) -> None:
        """The tier's arenas are consistent and none of its leases is left open."""
        self.tier.check_integrity()
        assert self.tier.open_leases() == 0, f"{self.tier.open_leases()} host-tier leases left open"


class RemoteRows:
    """Rows of a ``baton cache`` tier's regions, moved by this engine's own transfer backend.

    The backend is connected to ``client.endpoint()`` on first use and again whenever ``client.epoch``
    changes (the tier came back as another run). Transfer errors are logged once per tier run.

    Args:
        client: an attached ``HostCacheClient`` (or one still trying to attach).
        blocks, slots: the device pools (registered as ``"blocks"`` / ``"state"``).
        backend: a fresh backend to register the pools with (``make_backend("nixl")`` when omitted).

    Attributes:
        transfer_errors: row moves that failed (each a miss).
        connected_epoch: the client's epoch (tier run) the backend was last connected for (0: none yet).
    """

    def __init__(
        self,
        client: "HostCacheClient",
        blocks: BlockPool,
        slots: StateSlotPool,
        backend: TransferBackend | None = None,
    ):
        self.client = client
        self.blocks = blocks
        self.slots = slots
        self.backend = backend or make_backend("nixl")
        self.backend.register(BLOCKS, blocks.storage)
        self.has_state = bool(slots.layout.fields)
        if self.has_state:
            self.backend.register(STATE, slots.storage)
            self.staging = torch.zeros(1, slots.layout.nbytes, dtype=torch.uint8, device=slots.storage.device)
            self.backend.register(STAGING, self.staging)
        self.transfer_errors = 0
        self._peer: str | None = None
        self.connected_epoch = 0
        self._logged_epoch = 0  # the last epoch whose transfer error was logged

    def read(
        self, kv_pages: Sequence[int], block_ids: Sequence[int], kda_page: int | None, slot: int
    ) -> bool:
        """Read ``kv_pages`` into ``block_ids`` (one each) and ``kda_page`` (if any) into ``slot``."""
        copies = {BLOCKS: list(zip(block_ids, kv_pages, strict=True))}
        if kda_page is not None:
            copies[STATE] = [(slot, kda_page)]
        return self._moved(lambda peer: self.backend.read(peer, copies))

    def write_blocks(self, pages: Sequence[int], block_ids: Sequence[int]) -> bool:
        """Write the device blocks ``block_ids`` into ``pages`` (one each)."""
        if not pages:
            return True
        copies = {BLOCKS: list(zip(block_ids, pages, strict=True))}
        return self._moved(lambda peer: self.backend.write(peer, copies))

    def write_state(self, page: int, state_row: torch.Tensor) -> bool:
        """Write ``state_row`` (one slot's bytes, anywhere on the device) into the KDA page ``page``."""
        self.staging[0].copy_(state_row)
        nbytes = self.slots.layout.nbytes
        span = ByteSpan(STAGING, 0, STATE, page * nbytes, nbytes)
        return self._moved(lambda peer: self.backend.write_bytes(peer, [span]))

    def check_integrity(self) -> None:
        """Nothing to check here: the tier checks its arenas in its own process."""

    def close(self) -> None:
        """Close the transfer backend."""
        self.backend.close()

    def _moved(self, transfer) -> bool:
        """Run ``transfer(peer)``; ``False`` when not connected or it raised ``TransferError``."""
        try:
            peer = self._connected()
            if peer is None:
                return False
            transfer(peer)
            return True
        except TransferError as error:
            self.transfer_errors += 1
            if self._logged_epoch != self.client.epoch:
                self._logged_epoch = self.client.epoch
                log.warning("host cache %s: transfer failed (%s): a miss", self.client.address, error)
            return False

    def _connected(self) -> str | None:
        """The tier run's peer name, connecting when the client attached to a new run since."""
        if self.client.epoch == 0:
            return None  # never reached the tier
        if self.client.epoch != self.connected_epoch:
            self.connected_epoch = self.client.epoch  # a failed connect is not retried until the next run
            self._peer = None
            self._peer = self.backend.connect(self.client.endpoint())
        return self._peer


class SharedRows:
    """Rows of a ``baton cache`` tier on this machine whose arenas are shared-memory files
    (``services/hicache/shared_pages.py``): mapped into this process, page-locked when the pools are on
    a GPU, and copied with torch like ``LocalRows`` -- the bus's speed, where NIXL's one-sided moves
    between a device and another process's host memory go through bounce buffers. A tier run whose files
    cannot be mapped here (another machine, another mount namespace, private memory) is reached through
    ``remote`` (NIXL) instead; the choice is made again whenever the tier comes back as another run.

    Args:
        client: an attached ``HostCacheClient`` (or one still trying to attach).
        remote: the NIXL rows to the same tier (their pools are registered already).

    Attributes:
        mapped_epoch: the client's epoch (tier run) whose files are mapped now (0: none mapped).
    """

    def __init__(self, client: "HostCacheClient", remote: RemoteRows):
        self.client = client
        self.remote = remote
        self.blocks = remote.blocks
        self.slots = remote.slots
        self.mapped_epoch = 0
        self._copies: PageCopies | None = None
        self._pinned: list[torch.Tensor] = []
        self._epoch = 0
        self._rows()  # map (and page-lock) at start-up, not on the first request

    @property
    def transfer_errors(self) -> int:
        """Row moves over NIXL that failed (copies between mapped pages do not fail)."""
        return self.remote.transfer_errors

    def read(
        self, kv_pages: Sequence[int], block_ids: Sequence[int], kda_page: int | None, slot: int
    ) -> bool:
        """Read ``kv_pages`` into ``block_ids`` (one each) and ``kda_page`` (if any) into ``slot``."""
        return self._rows().read(kv_pages, block_ids, kda_page, slot)

    def write_blocks(self, pages: Sequence[int], block_ids: Sequence[int]) -> bool:
        """Write the device blocks ``block_ids`` into ``pages`` (one each)."""
        return self._rows().write_blocks(pages, block_ids)

    def write_state(self, page: int, state_row: torch.Tensor) -> bool:
        """Write ``state_row`` (one slot's bytes, anywhere on the device) into the KDA page ``page``."""
        return self._rows().write_state(page, state_row)

    def check_integrity(self) -> None:
        """Nothing to check here: the tier checks its arenas in its own process."""

    def close(self) -> None:
        """Drop the mappings and close the NIXL rows."""
        self._unmap()
        self.remote.close()

    def _rows(self) -> "PageCopies | RemoteRows":
        """The mapped pages of the tier run attached to now, else the NIXL rows."""
        if self.client.epoch != self._epoch:
            self._epoch = self.client.epoch
            self._unmap()
            self._copies = self._map()
            self.mapped_epoch = self._epoch if self._copies is not None else 0
        return self._copies if self._copies is not None else self.remote

    def _map(self) -> PageCopies | None:
        """Map the run's files when they are on this machine and hold this engine's rows; else None
        (logged once per run)."""
        shared = self.client.shared_pages()
        kv, kda = shared.get(KV), shared.get(KDA)
        has_state = bool(self.slots.layout.fields)
        why = None
        if kv is None or (has_state and kda is None):
            return None  # a tier keeping its pages private: NIXL, nothing to say
        if kv.node_id != node_id():
            why = "the tier runs on another machine"
        elif kv.page_bytes != self.blocks.layout.nbytes or (
            has_state and kda.page_bytes != self.slots.layout.nbytes
        ):
            why = "its pages are not this engine's rows"
        if why is None:
            try:
                storages = [map_pages(kv), *([map_pages(kda)] if has_state else [])]
                if self.blocks.storage.is_cuda:
                    for storage in storages:
                        pin_pages(storage)
                        self._pinned.append(storage)
                return PageCopies(storages[0], storages[1] if has_state else None, self.blocks, self.slots)
            except (ValueError, RuntimeError, OSError) as error:
                self._unmap()
                why = str(error)
        log.warning(
            "host cache %s: not mapping its shared pages (%s): moving rows over NIXL",
            self.client.address,
            why,
        )
        return None

    def _unmap(self) -> None:
        """Forget the mapped run (every copy has finished: each move waits for its copies)."""
        for storage in self._pinned:
            unpin_pages(storage)
        self._pinned = []
        self._copies = None
