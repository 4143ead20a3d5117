"""``RedisLink``: one connection to Redis that fails soft, for HiCache's cluster index and L3.

Redis is an optimisation (DESIGN.md section 8: without it everything still works, node-locally), so a
Redis that is down, restarting or unreachable must never fail a request or stall a caller: a call
that cannot reach it returns None at once, the link logs one line and reports itself down
(``on_health(False)``, the ``baton_hicache_redis_up`` gauge), and for ``retry_s`` it does not try
again, so a request path pays at most one short timeout per ``retry_s``. The first call that gets
through afterwards reports it up again and bumps ``epoch``: Redis may have lost everything meanwhile
(a restart), so a writer republishes what it holds when the epoch changes.

Torch-free (``common/``): the router and the workers both use it.
"""

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger(__name__)
T = TypeVar("T")

# A connection that breaks or a server that is loading: Redis is unavailable. Any other RedisError
# (a wrong command, a script error) is a bug and is raised.
_UNAVAILABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def check_redis_url(field: str, url: str) -> None:
    """A configured Redis URL, checked at start: "" (none) or one of ``REDIS_SCHEMES``.

    Raises:
        ValueError: naming ``field`` and what to give instead.
    """
    if url and not url.startswith(REDIS_SCHEMES):
        raise ValueError(f"{field}: {url!r} is not a Redis URL (give redis://HOST:PORT, or leave it empty)")


class RedisLink:
    """A soft-failing Redis client.

    Args:
        url: ``redis://host:port/db`` (what ``--redis-url`` gives).
        on_health: called with True / False when the link comes up or goes down (and once with the
            first call's outcome), e.g. to set the ``baton_hicache_redis_up`` gauge.
        timeout_s: connect and socket timeout of each call (kept short: callers sit on request paths).
        retry_s: after a failure, calls return None without trying for this long.
    """

    def __init__(
        self,
        url: str,
        on_health: Callable[[bool], None] | None = None,
        timeout_s: float = 0.5,
        retry_s: float = 1.0,
    ):
        if not url:
            raise ValueError("redis_url: empty (give redis://HOST:PORT, or turn Redis off with --no-redis)")
        try:
            self.client = redis.Redis.from_url(
                url,
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
                retry=Retry(NoBackoff(), 0),  # fail at once: the link's own backoff decides retries
            )
        except ValueError as error:
            raise ValueError(f"redis_url: {url!r} is not a Redis URL ({error})") from None
        self.url = url
        self.on_health = on_health or (lambda up: None)
        self.retry_s = retry_s
        self.epoch = 0  # bumped each time the link comes up (first call included)
        self._up: bool | None = None  # None: not tried yet
        self._next_try = 0.0
        self._lock = threading.Lock()

    @property
    def up(self) -> bool:
        """Whether the last call got through (False before the first call)."""
        return bool(self._up)

    def call(self, operation: Callable[[redis.Redis], T]) -> T | None:
        """``operation(client)``'s result, or None when Redis is unavailable (now, or failed less than
        ``retry_s`` ago). Thread-safe: the client pools its connections.

        Raises:
            redis.exceptions.RedisError: other than a connection error or timeout (a bug).
        """
        with self._lock:
            if self._up is False and time.monotonic() < self._next_try:
                return None
        try:
            result = operation(self.client)
        except _UNAVAILABLE as error:
            self._went_down(error)
            return None
        self._came_up()
        return result

    def _went_down(self, error: Exception) -> None:
        with self._lock:
            self._next_try = time.monotonic() + self.retry_s
            if self._up is False:
                return
            self._up = False
        log.warning("redis %s unavailable (%s): cluster index and L3 off until it answers", self.url, error)
        self.on_health(False)

    def _came_up(self) -> None:
        with self._lock:
            if self._up:
                return
            was, self._up = self._up, True
            self.epoch += 1
        if was is False:
            log.info("redis %s answers again", self.url)
        self.on_health(True)

    def close(self) -> None:
        """Close the pooled connections."""
        self.client.close()
