"""A host tier with a Redis L3 below it (real redis-server): evicted pages are written back off the put
path and a fresh tier prefetches them back bitwise, a snapshot included (hybrid rule); Redis down costs
only misses; the cluster index never sees L3 pages as the tier's."""

import hashlib

import torch

from deploy.local.redis_server import free_port
from services.hicache.host_tier import KDA, KV, HostTier
from services.hicache.redis_l3 import RedisL3
from services.hicache.tier_l3 import TierL3

KV_PAGE, KDA_PAGE = 48, 80


def chain(count: int, salt: str = "") -> list[bytes]:
    return [hashlib.sha256(f"{salt}block{i}".encode()).digest() for i in range(count)]


def row(kind: str, i: int) -> torch.Tensor:
    size = KV_PAGE if kind == KV else KDA_PAGE
    step = 7 if kind == KV else 11
    return torch.tensor([(i * 37 + j * step) % 256 for j in range(size)], dtype=torch.uint8)


def tier(kv_pages: int, kda_pages: int) -> HostTier:
    return HostTier(KV_PAGE, KDA_PAGE, kv_pages * KV_PAGE, kda_pages * KDA_PAGE, "layout", pin=False)


def put(host: HostTier, kind: str, hashes: list[bytes], first: int) -> None:
    lease = host.reserve_put(kind, hashes)
    for offset, page in enumerate(lease.pages):
        if page is not None:
            host.arena(kind).storage[page].copy_(row(kind, first + offset))
    host.commit_put(lease.lease_id)


def read(host: HostTier, kind: str, hashes: list[bytes]) -> list[torch.Tensor]:
    lease = host.begin_get(kind, hashes)
    rows = [host.arena(kind).storage[page].clone() for page in lease.pages]
    host.end_get(lease.lease_id)
    return rows


def with_l3(host: HostTier, url: str, prefix: str) -> TierL3:
    return TierL3(host, RedisL3(url, 1 << 20, host.layout_fingerprint, prefix=prefix))


def test_evicted_pages_land_in_l3_and_a_fresh_tier_prefetches_them_bitwise(redis_server, prefix):
    blocks = chain(6)
    first = tier(kv_pages=4, kda_pages=1)
    first_l3 = with_l3(first, redis_server.url, prefix)
    first.record_events()
    put(first, KV, blocks[:4], 0)
    put(first, KDA, [blocks[3]], 3)  # the snapshot after block 3
    put(first, KV, blocks[4:6], 4)  # evicts blocks 2 and 3 (the chain's tail first)
    put(first, KDA, [blocks[5]], 5)  # evicts the snapshot at depth 4
    assert first_l3.flush()
    evicted = {(e.kind, e.block_hash) for e in first.take_events() if not e.inserted}
    assert evicted == {(KV, blocks[2]), (KV, blocks[3]), (KDA, blocks[3])}  # the index drops them
    assert first_l3.stats()[KV].bytes_written == 2 * KV_PAGE
    assert first_l3.stats()[KDA].bytes_written == KDA_PAGE

    fresh = tier(kv_pages=8, kda_pages=2)
    fresh_l3 = with_l3(fresh, redis_server.url, prefix)
    put(fresh, KV, blocks[:2], 0)  # the tier holds the chain's first two blocks already
    assert fresh.match(blocks[:4], has_state=True).usable_depth == 0
    ticket = fresh_l3.prefetch(blocks[:4], has_state=True)
    assert ticket.wait(10) and (ticket.kv_pages, ticket.kda_pages) == (2, 1)
    assert fresh.match(blocks[:4], has_state=True).usable_depth == 4  # now tier hits
    for got, i in zip(read(fresh, KV, blocks[:4]), range(4), strict=True):
        assert torch.equal(got, row(KV, i))
    assert torch.equal(read(fresh, KDA, [blocks[3]])[0], row(KDA, 3))
    stats = fresh_l3.stats()
    assert (stats[KV].hits, stats[KV].misses, stats[KDA].hits) == (2, 0, 1)
    assert stats[KV].bytes_read == 2 * KV_PAGE and stats[KDA].bytes_read == KDA_PAGE
    for l3, host in ((first_l3, first), (fresh_l3, fresh)):
        l3.close()
        host.check_integrity()
        assert host.open_leases() == 0


def test_a_prefix_counts_only_to_the_deepest_snapshot_the_l3_gives(redis_server, prefix):
    blocks = chain(5, salt="hybrid")
    l3 = RedisL3(redis_server.url, 1 << 20, "layout", prefix=prefix)
    l3.put(KV, [(h, row(KV, i).numpy().tobytes()) for i, h in enumerate(blocks)])
    l3.put(KDA, [(blocks[1], row(KDA, 1).numpy().tobytes()), (blocks[4], row(KDA, 4).numpy().tobytes())])
    host = tier(kv_pages=8, kda_pages=2)
    tier_l3 = TierL3(host, l3)
    ticket = tier_l3.prefetch(blocks[:4], has_state=True)  # a prompt of 4 blocks: the depth-5 one is past it
    assert ticket.wait(10) and (ticket.kv_pages, ticket.kda_pages) == (4, 1)
    match = host.match(blocks[:4], has_state=True)
    assert (match.kv_depth, match.snapshot_depths, match.usable_depth) == (4, (2,), 2)
    tier_l3.close()
    host.check_integrity()


def test_redis_down_costs_misses_and_never_fails_a_put(prefix):
    host = tier(kv_pages=2, kda_pages=1)
    down = TierL3(host, RedisL3(f"redis://127.0.0.1:{free_port()}", 1 << 20, "layout", prefix=prefix))
    blocks = chain(4, salt="down")
    put(host, KV, blocks[:2], 0)
    put(host, KV, blocks[2:], 2)  # evicts the first two: the writer cannot store them
    assert down.flush()
    assert down.stats()[KV].dropped == 2 and down.stats()[KV].bytes_written == 0
    ticket = down.prefetch(blocks, has_state=False)
    assert ticket.wait(10) and ticket.kv_pages == 0
    assert down.stats()[KV].misses == 4  # the chain from its first (evicted) block, asked of a dead Redis
    assert all(torch.equal(got, row(KV, 2 + i)) for i, got in enumerate(read(host, KV, blocks[2:])))
    down.close()
    host.check_integrity()
