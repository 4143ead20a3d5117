"""Per-tenant request rate limits at the router (``--tenant-rate-limit``, ``--tenant-burst``).

Each tenant (the token's, or what the request names without authentication; "" is one tenant for every
client without one) has a token bucket: ``burst`` requests at once, refilled at ``rate`` a second. A
``Generate`` that finds its tenant's bucket empty is refused before it queues or reaches a worker,
with RESOURCE_EXHAUSTED (HTTP 429) and a message naming the tenant, the limit and when to retry, so one
tenant's flood cannot take the router's queue from the others. ``baton_router_rate_limited_total``
counts the refusals.

The buckets of at most ``max_tenants`` tenants are kept (self-asserted tenant names are unbounded); when
one more is needed, the least recently used goes, which loses nothing once it has refilled (a full
bucket is the same as none) and, at worst, gives that tenant a fresh burst.
"""

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from common.errors import NoCapacity


class RateLimited(NoCapacity):
    """A tenant over its request rate: RESOURCE_EXHAUSTED / HTTP 429, retry later."""


class TenantRateLimit:
    """Token buckets by tenant.

    Args:
        rate: requests a second each tenant may send, sustained (> 0).
        burst: requests a tenant may send at once (>= 1); None: ``ceil(rate)``.
        clock: monotonic seconds (tests pass a fake one).
        max_tenants: buckets kept (least recently used dropped first).

    Raises:
        ValueError: a rate that is not a positive finite number or a burst below 1, naming the flag.
    """

    def __init__(
        self,
        rate: float,
        burst: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_tenants: int = 65536,
    ):
        if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
            raise ValueError(
                f"--tenant-rate-limit: must be a positive number of requests a second, got {rate}"
            )
        burst = max(1, math.ceil(rate)) if burst is None else burst
        if not isinstance(burst, int) or isinstance(burst, bool) or burst < 1:
            raise ValueError(f"--tenant-burst: must be an integer >= 1, got {burst!r}")
        self.rate, self.burst, self.clock, self.max_tenants = float(rate), burst, clock, max_tenants
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tenant -> (tokens, at)
        self._lock = threading.Lock()

    def check(self, tenant: str) -> None:
        """Take one request from ``tenant``'s bucket.

        Raises:
            RateLimited: the bucket is empty; the message names the tenant and when one request frees.
        """
        now = self.clock()
        with self._lock:
            tokens, at = self._buckets.pop(tenant, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens >= 1.0:
                self._buckets[tenant] = (tokens - 1.0, now)
                self._trim()
                return
            self._buckets[tenant] = (tokens, now)
        wait_ms = math.ceil((1.0 - tokens) / self.rate * 1000)
        name = repr(tenant) if tenant else "(no tenant)"
        raise RateLimited(
            f"tenant {name}: over its rate limit ({self.rate:g} requests/s, burst {self.burst}); "
            f"retry in {wait_ms} ms"
        )

    def _trim(self) -> None:
        while len(self._buckets) > self.max_tenants:
            self._buckets.popitem(last=False)


def from_flags(rate: float, burst: int) -> TenantRateLimit | None:
    """The limit ``--tenant-rate-limit RATE --tenant-burst BURST`` ask for: None for rate 0 (no limit),
    burst 0 meaning the rate rounded up.

    Raises:
        ValueError: a burst without a rate, a negative or non-finite rate, a negative burst, naming the
            flag.
    """
    if rate == 0:
        if burst:
            raise ValueError("--tenant-burst: needs --tenant-rate-limit")
        return None
    if burst < 0:
        raise ValueError(f"--tenant-burst: must be >= 1 (0: the rate rounded up), got {burst}")
    return TenantRateLimit(rate, burst or None)
