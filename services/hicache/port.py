"""``HostTierPort``: what engine code needs of a host tier, satisfied by the in-process ``HostTier``
and by ``HostCacheClient`` (the ``baton cache`` service over gRPC).

The port covers the index and the leases; moving the bytes differs by where the tier lives: with an
in-process ``HostTier`` a worker copies rows of ``tier.kv.storage`` / ``tier.kda.storage`` with torch;
with a ``HostCacheClient`` it reads and writes the regions ``"blocks"`` (KV pages) / ``"state"``
(KDA pages) of ``client.endpoint()`` with its own transfer backend (the same names as its pools'),
rows numbered by the leases' pages.

A tier with a Redis L3 below it also satisfies ``PrefetchPort``: ``TierL3`` in the engine's process,
``HostCacheClient`` for ``baton cache`` (its ``Prefetch`` RPC; a service without an L3 answers at once).
"""

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from .host_tier import GetLease, KindStats, PutLease, TierMatch


@runtime_checkable
class HostTierPort(Protocol):
    """The host tier's index and leases (see ``host_tier.HostTier`` for each method's contract)."""

    layout_fingerprint: str

    def match(self, hashes: Sequence[bytes], has_state: bool) -> TierMatch:
        """What the tier holds of the chain; no page changes."""
        ...

    def reserve_put(self, kind: str, hashes: Sequence[bytes], tenant: str = "") -> PutLease:
        """Pages to write ``hashes`` into, owned by ``tenant`` (``None``: skip that hash)."""
        ...

    def commit_put(self, lease_id: int) -> None:
        """The put's pages are written: checksum them, make them findable."""
        ...

    def abort_put(self, lease_id: int) -> None:
        """Give the put's pages back unwritten."""
        ...

    def begin_get(self, kind: str, hashes: Sequence[bytes]) -> GetLease:
        """Lease the leading held, checksum-verified pages of ``hashes`` for reading."""
        ...

    def end_get(self, lease_id: int) -> None:
        """The get's pages have been read."""
        ...

    def record_lookup(self, kv_hits: int, kv_misses: int, kda_hits: int, kda_misses: int) -> None:
        """Count one admitted request's lookup in the tier's hits and misses."""
        ...

    def stats(self) -> dict[str, KindStats]:
        """Each kind's counters."""
        ...


@runtime_checkable
class PrefetchHandle(Protocol):
    """A prefetch in flight: ``done()`` once it finished, failed or was skipped (never raises)."""

    def done(self) -> bool:
        """Whether the prefetch is over."""
        ...

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once the prefetch is over: at once when it is, else on the thread that ends it."""
        ...


@runtime_checkable
class PrefetchPort(Protocol):
    """Starts bringing a chain's missing pages from the L3 into the host tier (``tier_l3.TierL3``)."""

    def prefetch(self, hashes: Sequence[bytes], has_state: bool, tenant: str = "") -> PrefetchHandle:
        """Start it (the pages brought back ``tenant``'s) and return at once."""
        ...
