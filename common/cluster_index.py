"""``ClusterIndex``: which node's HiCache tier holds which blocks, cluster-wide, in Redis.

Each node's host tier publishes the block hashes it holds (the engine's salted chain,
``common/prefix_hash.py``, as hex) from its insert / evict events; the router looks a prompt's
hashes up to score workers by their node's tier (``router/worker_pool.py``). In ``common/`` because
the router (torch-free) reads it and the tier writes it.

Redis keys (``prefix`` defaults to ``baton:hicache:``)::

    {prefix}nodes            set: the names of the nodes that published (a registry, never expires)
    {prefix}node:{node}:kv   set: hex hashes whose KV page the node's tier holds     TTL ttl_s
    {prefix}node:{node}:kda  set: hex hashes with a KDA snapshot in the node's tier  TTL ttl_s

Every publish (at least every ``ttl_s / 3`` with ``start``) refreshes the TTLs, so a dead node's
entries expire by themselves; a lookup drops a registered node whose sets are both gone. The
publisher keeps its own copy of what it holds (the truth; Redis is a replica of it): after Redis was
unreachable or lost the sets (a restart), the next publish rewrites them whole. One round trip per
call: a publish is one MULTI/EXEC pipeline, a lookup one Lua script that walks each live node's sets.
"""

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from .redis_link import RedisLink

KV = "kv"  # the kinds of HiCache pages (services/hicache/host_tier.py's names)
KDA = "kda"
KINDS = (KV, KDA)
_CHUNK = 1000  # hashes per SADD when a node's sets are rewritten whole

# KEYS[1] the registry; ARGV[1] the node key prefix, ARGV[2..] the prompt's hashes in chain order.
# Per live node with a hit: name, the leading run of KV hits, the depths (1-based) in that run with a
# KDA snapshot. A node whose sets have both expired leaves the registry.
_LOOKUP = """
local out = {}
for _, node in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local kv_key, kda_key = ARGV[1] .. node .. ':kv', ARGV[1] .. node .. ':kda'
  if redis.call('EXISTS', kv_key, kda_key) == 0 then
    redis.call('SREM', KEYS[1], node)
  else
    local depth, snapshots = 0, {}
    for i = 2, #ARGV do
      if redis.call('SISMEMBER', kv_key, ARGV[i]) == 0 then break end
      depth = i - 1
      if redis.call('SISMEMBER', kda_key, ARGV[i]) == 1 then snapshots[#snapshots + 1] = depth end
    end
    if depth > 0 then
      out[#out + 1] = node
      out[#out + 1] = depth
      out[#out + 1] = snapshots
    end
  end
end
return out
"""


@dataclass(frozen=True)
class IndexEvent:
    """One change of a node tier's holdings: ``block_hash`` of ``kind`` became readable (``inserted``)
    or stopped being. HiCache's ``TierEvent`` has these fields; either is published as is."""

    kind: str
    block_hash: bytes
    inserted: bool


class EventSource(Protocol):
    """What a tier offers the index (``HostTier``): its holdings once, then the changes since."""

    def record_events(self) -> set[tuple[str, bytes]]:
        """Start recording changes; returns every ``(kind, hash)`` held now."""

    def take_events(self) -> list[IndexEvent]:
        """The changes since the last call, oldest first."""


@dataclass(frozen=True)
class IndexMatch:
    """What one node's tier holds of a prompt, as the index says (the fields of HiCache's ``TierMatch``).

    Attributes:
        kv_depth: leading hashes (blocks) whose KV page the node holds.
        snapshot_depths: depths ``d`` <= ``kv_depth`` (1-based block counts) with a KDA snapshot under
            ``hashes[d - 1]``, ascending.
        usable_depth: blocks a worker on that node can load instead of computing (``usable_depth``).
    """

    kv_depth: int
    snapshot_depths: tuple[int, ...]
    usable_depth: int


def usable_depth(kv_depth: int, snapshot_depths: Sequence[int], has_state: bool) -> int:
    """The hybrid hit rule: a model with KDA state resumes only where a snapshot is, so its hit is the
    deepest snapshot depth within ``kv_depth`` (0 without one); a model without state uses all of
    ``kv_depth``."""
    if not has_state:
        return kv_depth
    return max((d for d in snapshot_depths if d <= kv_depth), default=0)


class ClusterIndex:
    """One process's handle on the cluster index: a node's publisher, or (``node`` None) a reader.

    Calls fail soft (``RedisLink``): with Redis down ``publish`` returns False and ``lookup`` {}, the
    ``on_health`` callback and one log line say so, and the link retries on later calls.

    Args:
        redis_url: ``redis://HOST:PORT``.
        node: this node's name (a tier publishing its holdings); None for a reader only (the router).
        ttl_s: how long a node's entries outlive its last publish.
        on_health: called with True / False as Redis comes up / goes down (``baton_hicache_redis_up``).
        prefix: the Redis key prefix (tests and shared Redis instances keep apart by it).
    """

    def __init__(
        self,
        redis_url: str,
        node: str | None = None,
        ttl_s: float = 30.0,
        on_health: Callable[[bool], None] | None = None,
        prefix: str = "baton:hicache:",
    ):
        if not ttl_s >= 1:
            raise ValueError(f"ttl_s: must be >= 1 second (Redis expires whole seconds), got {ttl_s}")
        if node is not None and (not node or ":" in node):
            raise ValueError(f"node: {node!r} must be a non-empty name without ':'")
        self.link = RedisLink(redis_url, on_health)
        self.node = node
        self.ttl_s = ttl_s
        self._registry = prefix + "nodes"
        self._node_prefix = prefix + "node:"
        self._held: dict[str, set[str]] = {kind: set() for kind in KINDS}
        self._published_epoch = -1  # the link epoch whose Redis holds our sets; -1: never written
        self._lookup = self.link.client.register_script(_LOOKUP)
        self._publish_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _key(self, node: str, kind: str) -> str:
        return f"{self._node_prefix}{node}:{kind}"

    def publish(self, events: Iterable[IndexEvent] = ()) -> bool:
        """Apply a tier's events and refresh this node's TTL; True once Redis has them.

        Args:
            events: ``IndexEvent`` s (or HiCache ``TierEvent`` s) in the order they happened.

        Events are applied to the node's own copy even when Redis is down; the next call that
        reaches Redis after a failure (or after Redis lost the sets) rewrites them whole.

        Raises:
            ValueError: a reader (no ``node``) publishing, or an event of an unknown kind.
        """
        if self.node is None:
            raise ValueError("node: a reader (node None) cannot publish; give the tier's node name")
        with self._publish_lock:
            touched = {kind: set() for kind in KINDS}
            for event in events:
                if event.kind not in KINDS:
                    raise ValueError(f"event: kind {event.kind!r} is not one of {', '.join(KINDS)}")
                hexed = event.block_hash.hex()
                (self._held[event.kind].add if event.inserted else self._held[event.kind].discard)(hexed)
                touched[event.kind].add(hexed)
            whole = self._published_epoch != self.link.epoch or not self.link.up
            present = self.link.call(lambda client: self._write(client, touched, whole))
            if present is None:
                return False
            if whole:
                self._published_epoch = self.link.epoch
            lost = any(self._held[kind] and not exists for kind, exists in zip(KINDS, present, strict=True))
            if lost:  # expired or flushed behind our back (a Redis restart): rewrite it all now
                present = self.link.call(lambda client: self._write(client, touched, True))
                if present is None:
                    return False
                self._published_epoch = self.link.epoch
            return True

    def _write(self, client, touched: dict[str, set[str]], whole: bool) -> list[bool]:
        """One MULTI/EXEC: this node's sets updated (or rewritten whole), TTLs refreshed, registered.
        Returns, per kind, whether its set exists after the refresh."""
        ttl = int(self.ttl_s)
        pipe = client.pipeline(transaction=True)
        for kind in KINDS:
            key = self._key(self.node, kind)
            if whole:
                pipe.delete(key)
                held = sorted(self._held[kind])
                for start in range(0, len(held), _CHUNK):
                    pipe.sadd(key, *held[start : start + _CHUNK])
            else:
                added = [h for h in touched[kind] if h in self._held[kind]]
                removed = [h for h in touched[kind] if h not in self._held[kind]]
                if added:
                    pipe.sadd(key, *added)
                if removed:
                    pipe.srem(key, *removed)
        for kind in KINDS:
            pipe.expire(self._key(self.node, kind), ttl)
        pipe.sadd(self._registry, self.node)
        replies = pipe.execute()
        return [bool(reply) for reply in replies[-3:-1]]

    def lookup(self, hashes: Sequence[bytes], has_state: bool) -> dict[str, IndexMatch]:
        """Per node whose tier holds the first block at least: what it holds of ``hashes`` (one
        prompt's chain, in order). {} when Redis is unavailable or nothing matches. A lookup changes
        nothing but the registry's dead names.

        Args:
            hashes: the prompt's block hashes under the salt the tiers key by.
            has_state: the model has KDA state (the hybrid rule cuts hits back to snapshots).
        """
        if not hashes:
            return {}
        args = [self._node_prefix] + [block_hash.hex() for block_hash in hashes]
        reply = self.link.call(lambda client: self._lookup(keys=[self._registry], args=args, client=client))
        if reply is None:
            return {}
        matches = {}
        for at in range(0, len(reply), 3):
            node, kv_depth, snapshots = reply[at].decode(), int(reply[at + 1]), tuple(reply[at + 2])
            matches[node] = IndexMatch(kv_depth, snapshots, usable_depth(kv_depth, snapshots, has_state))
        return matches

    def start(self, tier: EventSource, interval_s: float) -> None:
        """Publish ``tier``'s holdings, then its ``take_events()`` every ``interval_s`` on a thread
        until ``close`` (each publish also refreshes the TTL, so a live node never expires). Only
        ``record_events`` runs in the caller: no Redis call, so a tier's request path never waits.

        Raises:
            ValueError: ``interval_s`` is not at most a third of ``ttl_s`` (entries would expire
                between publishes of a live node).
        """
        if not 0 < interval_s <= self.ttl_s / 3:
            raise ValueError(f"interval_s: must be in (0, ttl_s / 3 = {self.ttl_s / 3:g}], got {interval_s}")
        held = [IndexEvent(kind, block_hash, True) for kind, block_hash in tier.record_events()]

        def loop() -> None:
            self.publish(held)
            while not self._stop.wait(interval_s):
                self.publish(tier.take_events())

        self._thread = threading.Thread(target=loop, name=f"cluster-index-{self.node}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop publishing (entries then expire after ``ttl_s``) and close the connections."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.link.close()
