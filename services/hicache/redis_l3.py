"""``RedisL3``: HiCache's third level, pages (KV blocks and KDA snapshots) in Redis, cluster-wide, under one
byte budget.

A page is stored byte for byte as it sits in a host-tier page (``docs/hicache.md``), keyed by the
tier's layout fingerprint, its kind and its block hash, with its checksum (XXH3-64,
``page_checksum.py``) in front::

    {prefix}page:{fingerprint}:{kind}:{hex hash}   <XXH3-64 little-endian, 8 bytes><page bytes>
    {prefix}lru      zset: page key -> tick of its last put or get (oldest evicted first)
    {prefix}sizes    hash: page key -> its stored bytes
    {prefix}used     the bytes the L3's pages take, against ``budget_bytes``
    {prefix}tick     the LRU clock (Redis's own counter: no clock skew between nodes)

A put evicts the least recently used pages until the new one fits, inside one Lua script, so writers
on many nodes share the budget without races; a get refreshes what it read. A page whose checksum or
size does not match is dropped and counted (``checksum_failures``), and the read stops before it, as
the host tier's ``begin_get`` does: the caller recomputes from there. A different layout never reads
a page (the fingerprint is in the key). Every process should give the same ``budget_bytes``
(``--redis-l3-gib``): a put enforces the budget it is given.

Calls fail soft like the cluster index (``common/redis_link.py``): Redis down, a put stores nothing and
a get finds nothing. One round trip per batch. Torch-free: pages are ``bytes`` (a tier passes
``storage[page].numpy()`` rows and reads into them).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from common.cluster_index import KINDS
from common.redis_link import RedisLink

from .page_checksum import CHECKSUM_BYTES, page_checksum

# KEYS: lru, sizes, used, tick. ARGV[1]: the budget; then (key, value) pairs. Returns pages stored.
_PUT = """
local budget = tonumber(ARGV[1])
local used = tonumber(redis.call('GET', KEYS[3]) or '0')
local stored = 0
for i = 2, #ARGV, 2 do
  local key, value = ARGV[i], ARGV[i + 1]
  local tick = redis.call('INCR', KEYS[4])
  if redis.call('EXISTS', key) == 1 then
    redis.call('ZADD', KEYS[1], tick, key)
  elseif #value <= budget then
    while used + #value > budget do
      local oldest = redis.call('ZPOPMIN', KEYS[1])
      if #oldest == 0 then break end
      used = used - tonumber(redis.call('HGET', KEYS[2], oldest[1]) or '0')
      redis.call('HDEL', KEYS[2], oldest[1])
      redis.call('DEL', oldest[1])
    end
    redis.call('SET', key, value)
    redis.call('ZADD', KEYS[1], tick, key)
    redis.call('HSET', KEYS[2], key, #value)
    used = used + #value
    stored = stored + 1
  end
end
redis.call('SET', KEYS[3], used)
return stored
"""

# KEYS: lru, sizes, used, tick. ARGV: page keys in chain order. The leading pages present (their LRU
# refreshed). A page Redis itself evicted (maxmemory) leaves the books when a get finds it gone.
_GET = """
local out = {}
for i = 1, #ARGV do
  local value = redis.call('GET', ARGV[i])
  if not value then
    local size = redis.call('HGET', KEYS[2], ARGV[i])
    if size then
      redis.call('HDEL', KEYS[2], ARGV[i])
      redis.call('ZREM', KEYS[1], ARGV[i])
      redis.call('DECRBY', KEYS[3], size)
    end
    break
  end
  redis.call('ZADD', KEYS[1], redis.call('INCR', KEYS[4]), ARGV[i])
  out[#out + 1] = value
end
return out
"""

# KEYS: lru, tick. ARGV: page keys, shallowest first. The deepest page present, as {its 1-based index,
# its value} ({} for none), its LRU refreshed: the one KDA snapshot a prefetch wants (snapshots are
# sparse, so a leading run says nothing).
_GET_DEEPEST = """
for i = #ARGV, 1, -1 do
  local value = redis.call('GET', ARGV[i])
  if value then
    redis.call('ZADD', KEYS[1], redis.call('INCR', KEYS[2]), ARGV[i])
    return {i, value}
  end
end
return {}
"""

# KEYS: lru, sizes, used. ARGV: page keys to drop (corrupt). Returns the bytes freed.
_DROP = """
local freed = 0
for i = 1, #ARGV do
  freed = freed + tonumber(redis.call('HGET', KEYS[2], ARGV[i]) or '0')
  redis.call('HDEL', KEYS[2], ARGV[i])
  redis.call('ZREM', KEYS[1], ARGV[i])
  redis.call('DEL', ARGV[i])
end
redis.call('DECRBY', KEYS[3], freed)
return freed
"""


@dataclass(frozen=True)
class L3Stats:
    """Counters of this process's calls since start, and the L3's size as Redis last said."""

    pages_put: int
    pages_hit: int
    checksum_failures: int
    used_bytes: int


class RedisL3:
    """Pages in Redis under ``budget_bytes``, read and written in batches along a block-hash chain.

    Args:
        redis_url: ``redis://HOST:PORT``.
        budget_bytes: the most bytes the L3's pages (with their 8-byte checksums) may take in Redis.
        layout_fingerprint: the host tier's layout fingerprint (pages of another layout never match).
        on_health: the ``RedisLink`` callback (``baton_hicache_redis_up``).
        prefix: the Redis key prefix.

    Raises:
        ValueError: a budget < 1 byte or an empty fingerprint, naming the field.
    """

    def __init__(
        self,
        redis_url: str,
        budget_bytes: int,
        layout_fingerprint: str,
        on_health: Callable[[bool], None] | None = None,
        prefix: str = "baton:hicache:l3:",
    ):
        if budget_bytes < 1:
            raise ValueError(f"redis_l3_gib: the L3 budget must be > 0 bytes, got {budget_bytes}")
        if not layout_fingerprint:
            raise ValueError("layout_fingerprint: empty (the host tier's layout names the L3's pages)")
        self.link = RedisLink(redis_url, on_health)
        self.budget_bytes = budget_bytes
        self._page_prefix = f"{prefix}page:{layout_fingerprint}:"
        self._lru, self._sizes = prefix + "lru", prefix + "sizes"
        self._used, self._tick = prefix + "used", prefix + "tick"
        self._put = self.link.client.register_script(_PUT)
        self._get = self.link.client.register_script(_GET)
        self._drop = self.link.client.register_script(_DROP)
        self._get_deepest = self.link.client.register_script(_GET_DEEPEST)
        self._pages_put = self._pages_hit = self._checksum_failures = 0

    def _key(self, kind: str, block_hash: bytes) -> str:
        if kind not in KINDS:
            raise ValueError(f"kind: {kind!r} is not one of {', '.join(KINDS)}")
        return f"{self._page_prefix}{kind}:{block_hash.hex()}"

    def put(self, kind: str, pages: Sequence[tuple[bytes, bytes]]) -> int:
        """Store ``(block_hash, page)`` pairs (a page already there is only refreshed), evicting the
        L3's least recently used pages to stay within the budget. Returns the pages newly stored (0
        when Redis is unavailable). One round trip."""
        if not pages:
            return 0
        args: list = [self.budget_bytes]
        for block_hash, page in pages:
            args += [
                self._key(kind, block_hash),
                page_checksum(page).to_bytes(CHECKSUM_BYTES, "little") + bytes(page),
            ]
        keys = [self._lru, self._sizes, self._used, self._tick]
        stored = self.link.call(lambda client: self._put(keys=keys, args=args, client=client))
        self._pages_put += stored or 0
        return stored or 0

    def get(self, kind: str, hashes: Sequence[bytes], page_bytes: int) -> list[bytes]:
        """The pages of the leading ``hashes`` the L3 holds intact, in order: the run stops at the first
        missing page, or at one whose checksum or size is wrong (dropped from Redis and counted).
        [] when Redis is unavailable. One round trip (two with a corrupt page)."""
        if not hashes:
            return []
        names = [self._key(kind, block_hash) for block_hash in hashes]
        keys = [self._lru, self._sizes, self._used, self._tick]
        found = self.link.call(lambda client: self._get(keys=keys, args=names, client=client))
        pages = []
        for name, stored in zip(names, found or [], strict=False):
            stored_sum, page = int.from_bytes(stored[:CHECKSUM_BYTES], "little"), stored[CHECKSUM_BYTES:]
            if len(page) != page_bytes or page_checksum(page) != stored_sum:
                self._checksum_failures += 1
                self._drop_page(name)
                break
            pages.append(page)
        self._pages_hit += len(pages)
        return pages

    def get_deepest(self, kind: str, hashes: Sequence[bytes], page_bytes: int) -> tuple[int, bytes] | None:
        """``(index, page)`` of the deepest of ``hashes`` the L3 holds, or None (none, Redis unavailable,
        or that page's checksum or size is wrong: dropped and counted, as in ``get``). One round trip."""
        if not hashes:
            return None
        names = [self._key(kind, block_hash) for block_hash in hashes]
        keys = [self._lru, self._tick]
        found = self.link.call(lambda client: self._get_deepest(keys=keys, args=names, client=client))
        if not found:
            return None
        index, stored = int(found[0]) - 1, found[1]
        stored_sum, page = int.from_bytes(stored[:CHECKSUM_BYTES], "little"), stored[CHECKSUM_BYTES:]
        if len(page) != page_bytes or page_checksum(page) != stored_sum:
            self._checksum_failures += 1
            self._drop_page(names[index])
            return None
        self._pages_hit += 1
        return index, page

    def _drop_page(self, name: str) -> None:
        keys = [self._lru, self._sizes, self._used]
        self.link.call(lambda client: self._drop(keys=keys, args=[name], client=client))

    def stats(self) -> L3Stats:
        """This process's counters, and the L3's used bytes (-1 when Redis is unavailable)."""
        used = self.link.call(lambda client: client.get(self._used))
        return L3Stats(
            self._pages_put,
            self._pages_hit,
            self._checksum_failures,
            -1 if used is None and not self.link.up else int(used or 0),
        )

    def close(self) -> None:
        """Close the pooled connections."""
        self.link.close()
