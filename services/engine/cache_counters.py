"""The prefix cache's counters: where prompt tokens' cached state came from, and what moved between
the device pools and the host tier (``docs/metrics.md``, the ``baton_prefix_cache_*`` and the worker's
``baton_hicache_*`` metrics).

The cache manager and its ``HostCacheConnector`` add to one ``CacheCounters`` as things happen (plain
integer adds, once per request admitted or per put and get: never per token); the worker reads a
``CacheCounts`` of the totals once per engine pass and turns the growth into Prometheus counters.
"""

from collections import Counter
from dataclasses import dataclass, field

from services.hicache.host_tier import KINDS

DEVICE, HOST, L3 = "device", "host", "l3"  # where a prefix hit's state came from
TIERS = (DEVICE, HOST, L3)
TO_HOST, TO_DEVICE = "to_host", "to_device"  # bytes moved between the device pools and the tier
DIRECTIONS = (TO_HOST, TO_DEVICE)
# Why a load from the tier fell back to recomputing: a row move failed (a remote tier died mid-way),
# a page was gone by the time it was leased, a page failed its checksum (dropped by the tier).
MOVE_FAILED, SHORT_LEASE, CHECKSUM = "move_failed", "short_lease", "checksum"
FALLBACK_REASONS = (MOVE_FAILED, SHORT_LEASE, CHECKSUM)


@dataclass(frozen=True)
class CacheCounts:
    """The counters' totals at one moment (they only grow; ``tier_up`` is a state).

    Attributes:
        hit_tokens: ``(tier, kind) -> tokens``: prompt tokens of admitted requests whose cached KV
            (``kv``) or KDA state (``kda``: the snapshot restored covers every token before it) came
            from the device pool or a tier.
        moved_bytes: ``(kind, direction) -> bytes`` moved to the host tier (write-through, offload,
            snapshots) and to the device (loads).
        offloads: cached device blocks copied to the tier as the pool reused them.
        saves_skipped: ``kind -> pages`` not saved because the tier had no room (every page leased).
        load_fallbacks: ``reason -> loads`` from the tier that fell back to recomputing.
        tier_up: whether the tier answered its last call (``None``: no tier).
        tier_reconnects: times the engine attached to its tier again after an outage or a restart.
        host_tier: an in-process tier's own ``HostTier.stats()`` (kind -> ``KindStats``), which no
            ``baton cache`` exports for it; ``None`` for a remote tier or none.
    """

    hit_tokens: dict[tuple[str, str], int] = field(default_factory=dict)
    moved_bytes: dict[tuple[str, str], int] = field(default_factory=dict)
    offloads: int = 0
    saves_skipped: dict[str, int] = field(default_factory=dict)
    load_fallbacks: dict[str, int] = field(default_factory=dict)
    tier_up: bool | None = None
    tier_reconnects: int = 0
    host_tier: dict | None = None


class CacheCounters:
    """The running counters (the engine loop thread adds to them; ``counts`` copies them). Every label
    combination starts at 0, so each exported series exists from the start (``l3`` stays 0 until an L3
    serves hits)."""

    def __init__(self):
        self.hit_tokens = Counter({(tier, kind): 0 for tier in TIERS for kind in KINDS})
        self.moved_bytes = Counter({(kind, way): 0 for kind in KINDS for way in DIRECTIONS})
        self.offloads = 0
        self.saves_skipped = Counter(dict.fromkeys(KINDS, 0))
        self.load_fallbacks = Counter(dict.fromkeys(FALLBACK_REASONS, 0))

    def hit(self, tier: str, kind: str, tokens: int) -> None:
        """``tokens`` of an admitted request's prompt had their ``kind`` state cached in ``tier``."""
        if tokens:
            self.hit_tokens[tier, kind] += tokens

    def moved(self, kind: str, direction: str, nbytes: int) -> None:
        """``nbytes`` of ``kind`` pages moved ``direction``."""
        if nbytes:
            self.moved_bytes[kind, direction] += nbytes

    def counts(
        self, tier_up: bool | None = None, tier_reconnects: int = 0, host_tier: dict | None = None
    ) -> CacheCounts:
        """A copy of the totals, with the tier's reachability as the caller sees it (and an in-process
        tier's stats)."""
        return CacheCounts(
            dict(self.hit_tokens),
            dict(self.moved_bytes),
            self.offloads,
            dict(self.saves_skipped),
            dict(self.load_fallbacks),
            tier_up,
            tier_reconnects,
            host_tier,
        )
