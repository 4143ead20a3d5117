"""One kind's host pages (KV blocks or KDA snapshots): memory, the hash index, LRU eviction, checksums.

Every page is in exactly one of four states::

    free      no hash                       in ``_free``
    writing   reserved by a put, no reader  in ``_writing`` (hash -> page); not findable yet
    held      committed, no reader          in ``_lru`` (hash -> page, oldest first); evictable
    read      committed, readers > 0        in ``_read`` (hash -> page); never evicted

``reserve`` takes free pages first, then evicts the least recently used *held* page; pages being
written or read are never evicted, so an arena full of them answers "no room" (``None``) instead of
failing. ``commit`` records each written page's checksum and makes it findable; ``acquire`` hands a
reader the pages with the checksums they must have, and ``reject`` takes back the run from the first
page whose bytes do not match: that page is dropped (counted in ``checksum_failures``). The caller
computes the checksums (``page_checksum.py``) between the calls, while the pages are leased, so a slow
checksum never holds the caller's lock.

Within one call, deeper hashes of a chain are made *less* recent than their ancestors (pages are
touched from the last hash to the first), so eviction takes a cached chain from its tail and the
prefix that later requests can still match survives longest.

Tenants (``tenant_reserve``, ``--tenant-cache-reserve-pages``): a page belongs to the tenant whose put
reserved it ("" is the anonymous tenant, a tenant like any other; keys are salted per tenant, so no page
is shared between tenants). ``held_by`` counts each tenant's committed (held or read) pages. A put for
tenant ``t`` that must evict takes the least recently used held page that is ``t``'s own or whose owner
holds more than ``tenant_reserve`` pages; other tenants' pages at or below their reserve are skipped, and
when nothing else is left the put gets "no room". One tenant's load thus never takes another tenant's
reserved share; with ``tenant_reserve`` 0 eviction is plain LRU.

Not thread-safe: ``HostTier`` serializes every call.
"""

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

PageMemory = Callable[[str, int, int], torch.Tensor]  # (kind, num_pages, page_bytes) -> [pages, bytes] uint8


class EvictedPage(NamedTuple):
    """A held page ``reserve`` took for another hash: its old hash, the page (its bytes stay intact until
    the put that reserved it writes) and the checksum they had."""

    block_hash: bytes
    page: int
    checksum: int


class PageArena:
    """``budget_bytes // page_bytes`` host pages of ``page_bytes`` bytes each, indexed by block hash.

    Args:
        kind: what the pages hold (``"kv"`` or ``"kda"``); names this arena in errors.
        page_bytes: one page: a packed block or a whole KDA state slot, byte for byte.
        budget_bytes: the arena's memory; must hold at least one page.
        pin: page-lock the storage (faster device copies; needs CUDA).
        page_memory: makes the storage instead, from ``(kind, num_pages, page_bytes)`` (shared memory
            other processes map: ``shared_pages.py``); ``None``: private memory, pinned if ``pin``.
        tenant_reserve: committed pages each tenant keeps against other tenants' puts (0: none).

    Attributes:
        held_by: tenant -> its committed (held or read) pages; tenants with none are absent.

    Raises:
        ValueError: ``page_bytes`` < 1, a budget smaller than one page or a negative ``tenant_reserve``,
            naming the field.
    """

    def __init__(
        self,
        kind: str,
        page_bytes: int,
        budget_bytes: int,
        pin: bool = torch.cuda.is_available(),
        page_memory: PageMemory | None = None,
        tenant_reserve: int = 0,
    ):
        if page_bytes < 1:
            raise ValueError(f"{kind}_page_bytes: must be >= 1, got {page_bytes}")
        if budget_bytes < page_bytes:
            raise ValueError(
                f"{kind}_budget_bytes: {budget_bytes} bytes is smaller than one {kind} page "
                f"({page_bytes} bytes); give the {kind} tier at least one page or turn it off"
            )
        if tenant_reserve < 0:
            raise ValueError(f"tenant_cache_reserve_pages: must be >= 0, got {tenant_reserve}")
        self.kind = kind
        self.tenant_reserve = tenant_reserve
        self.held_by: dict[str, int] = {}
        self.page_bytes = page_bytes
        self.num_pages = budget_bytes // page_bytes
        if page_memory is not None:
            self.storage = page_memory(kind, self.num_pages, page_bytes)
        else:
            # Never zero-filled (a page is unreadable until written and committed): a large pinned
            # budget is ready at once.
            self.storage = torch.empty(self.num_pages, page_bytes, dtype=torch.uint8, pin_memory=pin)
        self._free: list[int] = list(range(self.num_pages - 1, -1, -1))  # pop() hands out page 0 first
        self._writing: dict[bytes, int] = {}
        self._lru: OrderedDict[bytes, int] = OrderedDict()
        self._read: dict[bytes, int] = {}
        self._readers = [0] * self.num_pages
        self._checksums: list[int | None] = [None] * self.num_pages
        self._owners: list[str] = [""] * self.num_pages  # the tenant of a writing or committed page
        self.evictions = 0
        self.checksum_failures = 0

    # ---- lookups (no side effects) -----------------------------------------------------------

    def holds(self, block_hash: bytes) -> bool:
        """True when a committed page holds ``block_hash``."""
        return block_hash in self._lru or block_hash in self._read

    def leading_depth(self, hashes: Sequence[bytes]) -> int:
        """How many leading ``hashes`` have a committed page."""
        depth = 0
        while depth < len(hashes) and self.holds(hashes[depth]):
            depth += 1
        return depth

    def held_hashes(self) -> list[bytes]:
        """Every hash with a committed page."""
        return [*self._lru, *self._read]

    @property
    def pages_used(self) -> int:
        """Pages not free (writing, held or read)."""
        return self.num_pages - len(self._free)

    # ---- put ---------------------------------------------------------------------------------

    def reserve(
        self, hashes: Sequence[bytes], tenant: str = ""
    ) -> tuple[tuple[int | None, ...], list[EvictedPage], int]:
        """A page to write for each hash, owned by ``tenant``, or ``None`` where it is already held or
        being written (its LRU place is refreshed; its owner stays) or where no page can be freed for
        ``tenant`` (see the module docstring).

        Returns:
            ``(pages, evicted, no_room)``: the pages in ``hashes`` order, the pages evicted to make
            room, and how many hashes got no page because none could be freed.
        """
        pages: list[int | None] = [None] * len(hashes)
        evicted: list[EvictedPage] = []
        no_room = 0
        for index in range(len(hashes) - 1, -1, -1):  # tail first: see the module docstring
            block_hash = hashes[index]
            if block_hash in self._lru:
                self._lru.move_to_end(block_hash)
                continue
            if block_hash in self._read or block_hash in self._writing:
                continue
            page = self._take_page(evicted, tenant)
            if page is None:
                no_room += 1
                continue
            self._writing[block_hash] = page
            self._owners[page] = tenant
            pages[index] = page
        return tuple(pages), evicted, no_room

    def writing_pages(self, hashes: Sequence[bytes]) -> list[int]:
        """The pages ``reserve`` gave ``hashes`` (still being written)."""
        return [self._writing[block_hash] for block_hash in hashes]

    def commit(self, hashes: Sequence[bytes], checksums: Sequence[int]) -> list[bytes]:
        """Make the written pages of ``hashes`` (reserved by ``reserve``) findable, with ``checksums``
        (``page_checksum`` of each, in ``hashes`` order); returns the hashes now inserted."""
        inserted = []
        for block_hash, checksum in zip(reversed(hashes), reversed(checksums), strict=True):
            page = self._writing.pop(block_hash)
            self._checksums[page] = checksum
            self._lru[block_hash] = page
            owner = self._owners[page]
            self.held_by[owner] = self.held_by.get(owner, 0) + 1
            inserted.append(block_hash)
        inserted.reverse()
        return inserted

    def abort(self, hashes: Sequence[bytes]) -> None:
        """Give back the pages reserved for ``hashes`` unwritten."""
        for block_hash in hashes:
            self._free.append(self._writing.pop(block_hash))

    # ---- get ---------------------------------------------------------------------------------

    def acquire(self, hashes: Sequence[bytes]) -> tuple[list[int], list[int]]:
        """Lease the pages of the leading held ``hashes`` for reading.

        Returns:
            ``(pages, checksums)``: the leased pages (a prefix of ``hashes``, up to the first hash not
            held) and the checksum each must have; verify them, then ``reject`` a run that fails.
        """
        pages: list[int] = []
        for block_hash in hashes:
            page = self._lru.get(block_hash, self._read.get(block_hash))
            if page is None:
                break
            if self._readers[page] == 0:
                del self._lru[block_hash]
                self._read[block_hash] = page
            self._readers[page] += 1
            pages.append(page)
        return pages, [self._checksums[page] for page in pages]

    def reject(self, hashes: Sequence[bytes], checksum: int) -> bool:
        """Take back acquired ``hashes`` whose first page failed its checksum (expected ``checksum``):
        release them all, count the failure and drop that page unless another reader holds it (then
        a later ``acquire`` and its check find it). Returns whether the page was dropped."""
        self.checksum_failures += 1
        self.release(hashes)
        corrupt = hashes[0]
        page = self._lru.get(corrupt)
        if page is None or self._checksums[page] != checksum:
            return False
        self._drop(corrupt, page)
        return True

    def release(self, hashes: Sequence[bytes]) -> None:
        """End one read of each of ``hashes`` (acquired by ``acquire``); unread pages become evictable
        again, as the most recently used (ancestors last: see the module docstring)."""
        for block_hash in reversed(hashes):
            page = self._read[block_hash]
            self._readers[page] -= 1
            if self._readers[page] == 0:
                del self._read[block_hash]
                self._lru[block_hash] = page

    # ---- integrity ---------------------------------------------------------------------------

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` unless every page is in exactly one state, the index agrees and
        ``held_by`` counts each tenant's committed pages."""
        states = [self._free, self._writing.values(), self._lru.values(), self._read.values()]
        pages = [page for state in states for page in state]
        assert sorted(pages) == list(range(self.num_pages)), f"{self.kind}: pages lost or in two states"
        hashes = [*self._writing, *self._lru, *self._read]
        assert len(hashes) == len(set(hashes)), f"{self.kind}: a hash on two pages"
        for page in range(self.num_pages):
            assert (self._readers[page] > 0) == (page in self._read.values()), f"{self.kind}: page {page}"
        counted: dict[str, int] = {}
        for page in [*self._lru.values(), *self._read.values()]:
            counted[self._owners[page]] = counted.get(self._owners[page], 0) + 1
        assert counted == self.held_by, f"{self.kind}: committed pages by tenant {self.held_by} != {counted}"

    # ---- internals ---------------------------------------------------------------------------

    def _take_page(self, evicted: list[EvictedPage], tenant: str) -> int | None:
        if self._free:
            return self._free.pop()
        victim = self._victim(tenant)
        if victim is None:
            return None
        page = self._lru.pop(victim)
        evicted.append(EvictedPage(victim, page, self._checksums[page]))
        self._uncount(page)
        self._checksums[page] = None
        self.evictions += 1
        return page

    def _victim(self, tenant: str) -> bytes | None:
        """The hash of the least recently used held page a put for ``tenant`` may evict: its own, or one
        whose owner holds more than its reserve (``None``: none). A scan past the protected pages, at most
        ``tenant_reserve`` per other tenant."""
        if not self.tenant_reserve:
            return next(iter(self._lru), None)
        for block_hash, page in self._lru.items():
            owner = self._owners[page]
            if owner == tenant or self.held_by[owner] > self.tenant_reserve:
                return block_hash
        return None

    def _uncount(self, page: int) -> None:
        """A committed ``page`` left the index: one page less for its owner."""
        owner = self._owners[page]
        self.held_by[owner] -= 1
        if not self.held_by[owner]:
            del self.held_by[owner]

    def _drop(self, block_hash: bytes, page: int) -> None:
        del self._lru[block_hash]
        self._uncount(page)
        self._checksums[page] = None
        self._free.append(page)
