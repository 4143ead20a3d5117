"""HiCache's L3 on a real redis-server: pages back bitwise along a chain, LRU eviction under the byte
budget, a corrupt or wrong-size page dropped and counted, layouts kept apart, Redis down fails soft."""

import hashlib

import pytest

from common.cluster_index import KDA, KV
from deploy.local.redis_server import free_port
from services.hicache.page_checksum import CHECKSUM_BYTES
from services.hicache.redis_l3 import RedisL3

PAGE = 64
STORED = PAGE + CHECKSUM_BYTES  # a page and its checksum


def chain(count: int) -> list[bytes]:
    return [hashlib.sha256(f"block{i}".encode()).digest() for i in range(count)]


def page(i: int) -> bytes:
    return bytes((i * 31 + j) % 256 for j in range(PAGE))


def l3_on(server, prefix: str, budget: int = 100 * STORED, fingerprint: str = "layout-a") -> RedisL3:
    return RedisL3(server.url, budget, fingerprint, prefix=prefix)


def test_pages_come_back_bitwise_and_the_run_stops_at_a_miss(redis_server, prefix):
    l3, blocks = l3_on(redis_server, prefix), chain(4)
    assert l3.put(KV, [(blocks[0], page(0)), (blocks[1], page(1)), (blocks[3], page(3))]) == 3
    assert l3.put(KV, [(blocks[0], page(0))]) == 0  # already there: refreshed, not stored again
    assert l3.get(KV, blocks, PAGE) == [page(0), page(1)]  # block 2 missing: the run stops there
    assert l3.get(KDA, blocks, PAGE) == []  # kinds apart
    assert l3.stats().used_bytes == 3 * STORED and l3.stats().pages_hit == 2


def test_the_budget_evicts_the_least_recently_used(redis_server, prefix):
    l3, blocks = l3_on(redis_server, prefix, budget=3 * STORED), chain(5)
    assert l3.put(KV, [(blocks[i], page(i)) for i in range(3)]) == 3
    assert l3.get(KV, blocks[:1], PAGE) == [page(0)]  # block 0 is now the most recent
    assert l3.put(KDA, [(blocks[3], page(3))]) == 1  # evicts block 1, the oldest
    assert l3.get(KV, blocks[1:2], PAGE) == [] and l3.get(KV, blocks[2:3], PAGE) == [page(2)]
    assert l3.get(KV, blocks[:1], PAGE) == [page(0)] and l3.get(KDA, blocks[3:4], PAGE) == [page(3)]
    assert l3.stats().used_bytes == 3 * STORED
    assert l3.put(KV, [(blocks[4], bytes(3 * STORED))]) == 0  # larger than the whole budget: refused


def test_a_corrupt_or_wrong_size_page_is_dropped_and_counted(redis_server, prefix):
    l3, blocks = l3_on(redis_server, prefix), chain(3)
    l3.put(KV, [(blocks[i], page(i)) for i in range(3)])
    key = f"{prefix}page:layout-a:kv:{blocks[1].hex()}"
    stored = bytearray(l3.link.client.get(key))
    stored[10] ^= 1
    l3.link.client.set(key, bytes(stored))
    assert l3.get(KV, blocks, PAGE) == [page(0)]  # stops before the corrupt page
    assert l3.stats().checksum_failures == 1 and not l3.link.client.exists(key)
    assert l3.stats().used_bytes == 2 * STORED
    assert l3.get(KV, blocks[:1], PAGE - 1) == []  # a page of another size: not this layout's
    assert l3.stats().checksum_failures == 2


def test_another_layout_never_reads_a_page(redis_server, prefix):
    blocks = chain(1)
    l3_on(redis_server, prefix).put(KV, [(blocks[0], page(0))])
    assert l3_on(redis_server, prefix, fingerprint="layout-b").get(KV, blocks, PAGE) == []


def test_redis_down_stores_and_finds_nothing():
    l3 = RedisL3(f"redis://127.0.0.1:{free_port()}", 10 * STORED, "layout-a")
    blocks = chain(1)
    assert l3.put(KV, [(blocks[0], page(0))]) == 0 and l3.get(KV, blocks, PAGE) == []
    assert not l3.link.up and l3.stats().used_bytes == -1


@pytest.mark.parametrize(
    "budget, fingerprint, message",
    [(0, "layout-a", "redis_l3_gib: the L3 budget must be > 0"), (10, "", "layout_fingerprint: empty")],
    ids=["no-budget", "no-fingerprint"],
)
def test_bad_settings_name_the_field(budget, fingerprint, message):
    with pytest.raises(ValueError, match=message):
        RedisL3("redis://127.0.0.1:1", budget, fingerprint)
