"""The cluster index fed by a real ``HostTier`` (its holdings, then its events) says what the tier's own
``match`` says, through puts, LRU evictions and a corrupt page dropped on read."""

from common.cluster_index import ClusterIndex, IndexEvent
from common.prefix_hash import chain_root, extend_chain
from services.hicache.host_tier import KDA, KV, HostTier

PAGE = 16
BLOCK = 4


def put(tier: HostTier, kind: str, hashes: list[bytes]) -> None:
    lease = tier.reserve_put(kind, hashes)
    for index, page in enumerate(lease.pages):
        if page is not None:
            tier.arena(kind).storage[page] = index + 1
    tier.commit_put(lease.lease_id)


def agrees(index: ClusterIndex, tier: HostTier, hashes: list[bytes]) -> None:
    """Published the tier's events; the index's view of ``hashes`` is the tier's (both hit rules)."""
    assert index.publish(tier.take_events())
    for has_state in (True, False):
        want = tier.match(hashes, has_state)
        got = index.lookup(hashes, has_state).get("node-a")
        if want.kv_depth == 0:
            assert got is None
            continue
        assert (got.kv_depth, got.usable_depth) == (want.kv_depth, want.usable_depth)
        assert got.snapshot_depths == tuple(d for d in want.snapshot_depths if d <= want.kv_depth)


def test_the_index_follows_the_tier(redis_server, prefix):
    tier = HostTier(PAGE, PAGE, 4 * PAGE, 2 * PAGE, "layout", pin=False)
    index = ClusterIndex(redis_server.url, "node-a", prefix=prefix)
    first = extend_chain([], list(range(4 * BLOCK)), BLOCK, chain_root("model"))
    second = extend_chain([], list(range(100, 100 + 3 * BLOCK)), BLOCK, chain_root("model"))
    put(tier, KV, first)
    put(tier, KDA, [first[1], first[3]])
    # What the tier holds when the index starts, then its events from there (ClusterIndex.start's way).
    assert index.publish(IndexEvent(kind, h, True) for kind, h in tier.record_events())
    agrees(index, tier, first)
    assert index.lookup(first, True)["node-a"].usable_depth == 4
    put(tier, KV, second[:2])  # evicts two of first's pages (the chain's tail first)
    put(tier, KDA, second[1:2])  # evicts a snapshot
    agrees(index, tier, first)
    agrees(index, tier, second)
    lease = tier.begin_get(KV, second[:1])
    tier.end_get(lease.lease_id)
    tier.arena(KV).storage[lease.pages[0]] ^= 1  # its bytes flip while it sits in the tier
    lease = tier.begin_get(KV, second)  # the corrupt page is dropped: an evicted event
    assert lease.pages == ()
    tier.end_get(lease.lease_id)
    agrees(index, tier, second)
    assert index.lookup(second, False) == {}
    tier.check_integrity()
