"""A worker's load and prefix-cache contents, pushed to whoever watches (the ``WatchLoad`` stream).

The engine loop thread calls ``publish`` after every pass; it never waits on a subscriber::

    loop thread ── publish(events) ──► pending events ──(at most every min_interval_s)──► broadcast
                                                                                 │ per subscriber,
    handler thread ◄── Subscription.next() ◄── bounded deque ◄───────────────────┘ never blocking

A broadcast carries the latest ``WorkerStats`` and the net prefix-cache change since the one before
(block hashes inserted and evicted). ``mirror`` is the set of hashes held as of the last broadcast, so
a full picture (a new subscriber's first message, or one that fell behind and lost its queue) plus
every later broadcast always adds up to the engine's cache. Keepalives come from the handler thread,
so a long engine step does not make a worker look silent.
"""

import threading
import time
from collections import deque
from collections.abc import Iterator

from proto.baton.v1 import workers_pb2
from services.engine.cache.block_pool import CacheEvent

from .worker_stats import StatsBoard


class Subscription:
    """One watcher's queue; ``LoadFeed.updates`` reads it. Guarded by the feed's lock."""

    def __init__(self, lock: threading.Lock, max_queued: int):
        self.ready = threading.Condition(lock)
        self.queued: deque[workers_pb2.LoadUpdate] = deque()
        self.max_queued = max_queued
        self.stale = False  # fell behind: its next message is a full picture
        self.ended = False

    def offer(self, update: workers_pb2.LoadUpdate) -> None:
        """Queue ``update`` (lock held); a full queue is dropped and the subscriber marked stale."""
        if len(self.queued) >= self.max_queued:
            self.queued.clear()
            self.stale = True
        else:
            self.queued.append(update)
        self.ready.notify()


class LoadFeed:
    """Publishes one worker's load.

    Args:
        stats: the worker's stats snapshot (``publish`` runs after its ``update``).
        model_fingerprint: the prefix hash chain's salt (``EngineCore.model_fingerprint``).
        prefix_caching: whether the engine reuses prefixes at all.
        layout: the worker's handoff layout (``EngineService.layout`` as a ``CacheLayout``), sent on
            every full picture: the router pairs workers by it.
        cached: the block hashes the cache held when its events started (``EngineService.cached_at_start``).
        min_interval_s: the least time between two broadcasts (changes in between are coalesced).
        keepalive_s: the longest a watcher waits for a message.
        max_queued: updates a subscriber may fall behind before it gets a full picture instead.
    """

    def __init__(
        self,
        stats: StatsBoard,
        model_fingerprint: str,
        prefix_caching: bool,
        cached: frozenset[bytes],
        layout: workers_pb2.CacheLayout | None = None,
        min_interval_s: float = 0.02,
        keepalive_s: float = 1.0,
        max_queued: int = 64,
    ):
        self.stats = stats
        self.model_fingerprint = model_fingerprint
        self.prefix_caching = prefix_caching
        self.layout = layout
        self.min_interval_s = min_interval_s
        self.keepalive_s = keepalive_s
        self.max_queued = max_queued
        self._lock = threading.Lock()
        self._subscribers: list[Subscription] = []
        self._mirror: set[bytes] = set(cached)  # the hashes held as of the last broadcast's events
        self._pending: dict[bytes, bool] = {}  # hash -> held at the last broadcast (first touch wins)
        self._sent_stats: workers_pb2.WorkerStats | None = None
        self._sent_at = 0.0
        self._closed = False

    def publish(self, events: tuple[CacheEvent, ...]) -> None:
        """Add one engine pass's cache events; broadcast if anything changed and one is due (loop thread,
        after the stats snapshot's update)."""
        stats = self.stats.latest()
        with self._lock:
            for event in events:
                self._pending.setdefault(event.block_hash, event.block_hash in self._mirror)
                if event.inserted:
                    self._mirror.add(event.block_hash)
                else:
                    self._mirror.discard(event.block_hash)
            now = time.monotonic()
            urgent = self._sent_stats is not None and stats.draining != self._sent_stats.draining
            if not (self._pending or stats != self._sent_stats):
                return
            if not urgent and now - self._sent_at < self.min_interval_s:
                return  # coalesced into the next one
            update = workers_pb2.LoadUpdate(stats=stats)
            for block_hash, was_held in self._pending.items():
                held = block_hash in self._mirror
                if held and not was_held:
                    update.inserted.append(block_hash)
                elif was_held and not held:
                    update.evicted.append(block_hash)
            self._pending.clear()
            self._sent_stats, self._sent_at = stats, now
            for subscriber in self._subscribers:
                subscriber.offer(update)

    def updates(self, context=None) -> Iterator[workers_pb2.LoadUpdate]:
        """A full picture, then every broadcast (or a keepalive), until the caller or the feed goes.

        ``context``: the gRPC call's context; its end ends the stream at once.
        """
        subscription = Subscription(self._lock, self.max_queued)
        with self._lock:
            first = self._full_picture()
            self._subscribers.append(subscription)
        if context is not None:
            context.add_callback(lambda: self._end(subscription))
        try:
            yield first
            while True:
                update = self._next(subscription)
                if update is None:
                    return
                yield update
        finally:
            self._end(subscription)

    def _next(self, subscription: Subscription) -> workers_pb2.LoadUpdate | None:
        with self._lock:
            if not (subscription.queued or subscription.stale or subscription.ended or self._closed):
                subscription.ready.wait(self.keepalive_s)
            if subscription.ended or self._closed:
                return None
            if subscription.stale:
                subscription.stale = False
                subscription.queued.clear()
                return self._full_picture()
            if subscription.queued:
                return subscription.queued.popleft()
        return workers_pb2.LoadUpdate(stats=self.stats.latest())  # keepalive

    def _full_picture(self) -> workers_pb2.LoadUpdate:
        """Everything as of the last broadcast (lock held)."""
        return workers_pb2.LoadUpdate(
            stats=self._sent_stats or self.stats.latest(),
            full=True,
            model_fingerprint=self.model_fingerprint,
            prefix_caching=self.prefix_caching,
            inserted=sorted(self._mirror),
            layout=self.layout,
        )

    def _end(self, subscription: Subscription) -> None:
        with self._lock:
            subscription.ended = True
            subscription.ready.notify()
            if subscription in self._subscribers:
                self._subscribers.remove(subscription)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def close(self) -> None:
        """End every stream (the worker is stopping: its server need not wait for them)."""
        with self._lock:
            self._closed = True
            for subscription in self._subscribers:
                subscription.ready.notify()
