"""The in-process host tier: budgets, leases, LRU per kind, the hybrid rule, checksums, tenant salts."""

import random
import sys
import threading

import pytest
import torch

from common.prefix_hash import chain_root, extend_chain
from services.hicache.host_tier import KDA, KV, NO_LEASE, HostTier, TierEvent
from services.hicache.page_arena import PageArena
from services.hicache.port import HostTierPort

KV_PAGE = 64
KDA_PAGE = 96
BLOCK = 4


def chain(tokens: list[int], tenant: str = "") -> list[bytes]:
    return extend_chain([], tokens, BLOCK, chain_root("model-fp", tenant=tenant))


def make_tier(kv_pages: int = 8, kda_pages: int = 4) -> HostTier:
    return HostTier(KV_PAGE, KDA_PAGE, kv_pages * KV_PAGE, kda_pages * KDA_PAGE, "layout-fp", pin=False)


def page_bytes(seed: int, size: int) -> torch.Tensor:
    return torch.randint(0, 256, (size,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def put(tier: HostTier, kind: str, hashes: list[bytes], seed: int = 0) -> dict[bytes, torch.Tensor]:
    """Reserve, write distinct bytes into each given page, commit; returns what was written per hash."""
    lease = tier.reserve_put(kind, hashes)
    storage = tier.arena(kind).storage
    written = {}
    for index, (block_hash, page) in enumerate(zip(hashes, lease.pages, strict=True)):
        if page is not None:
            storage[page] = page_bytes(seed + index, storage.shape[1])
            written[block_hash] = storage[page].clone()
    tier.commit_put(lease.lease_id)
    return written


@pytest.fixture
def tier():
    tier = make_tier()
    assert tier.record_events() == set()
    yield tier
    tier.check_integrity()
    assert tier.open_leases() == 0


def test_budget_smaller_than_a_page_names_the_field():
    with pytest.raises(ValueError, match="kv_budget_bytes"):
        HostTier(KV_PAGE, KDA_PAGE, KV_PAGE - 1, KDA_PAGE, "fp", pin=False)
    with pytest.raises(ValueError, match="kda_budget_bytes"):
        HostTier(KV_PAGE, KDA_PAGE, KV_PAGE, KDA_PAGE - 1, "fp", pin=False)
    with pytest.raises(ValueError, match="kv_page_bytes"):
        PageArena(KV, 0, 100, pin=False)


def test_budgets_apart_and_satisfies_the_port(tier):
    assert isinstance(tier, HostTierPort)
    assert tier.kv.storage.shape == (8, KV_PAGE) and tier.kda.storage.shape == (4, KDA_PAGE)
    stats = tier.stats()
    assert (stats[KV].pages_total, stats[KDA].pages_total) == (8, 4)
    assert (stats[KV].pages_used, stats[KDA].pages_used) == (0, 0)


def test_put_then_get_round_trips_bytes_and_counts(tier):
    hashes = chain(list(range(16)))  # 4 blocks
    written = put(tier, KV, hashes)
    assert tier.take_events() == [TierEvent(KV, h, True) for h in hashes]
    for _ in range(3):  # a waiting request is matched on every scheduler pass: counted by none
        assert tier.match(hashes, has_state=False).kv_depth == 4
    assert tier.stats()[KV].hits == 0
    tier.record_lookup(kv_hits=4, kv_misses=0, kda_hits=0, kda_misses=0)  # once, when it is admitted
    lease = tier.begin_get(KV, hashes)
    assert len(lease.pages) == 4
    for block_hash, page in zip(hashes, lease.pages, strict=True):
        assert torch.equal(tier.kv.storage[page], written[block_hash])
    tier.end_get(lease.lease_id)
    stats = tier.stats()[KV]
    assert (stats.pages_used, stats.hits, stats.bytes_in, stats.bytes_out) == (4, 4, 4 * KV_PAGE, 4 * KV_PAGE)
    again = tier.reserve_put(KV, hashes)  # all held: nothing to write, no lease to end
    assert (again.lease_id, again.pages) == (NO_LEASE, (None,) * 4) and tier.open_leases() == 0
    tier.commit_put(again.lease_id)  # nothing to do (a remote client skips the call)
    missing = tier.begin_get(KV, chain(list(range(100, 108))))  # nothing held: no lease either
    assert (missing.lease_id, missing.pages) == (NO_LEASE, ()) and tier.open_leases() == 0
    tier.end_get(missing.lease_id)


def test_uncommitted_put_is_not_findable_and_abort_frees(tier):
    hashes = chain(list(range(8)))
    lease = tier.reserve_put(KV, hashes)
    assert tier.match(hashes, has_state=False).kv_depth == 0
    assert tier.stats()[KV].pages_used == 2
    tier.abort_put(lease.lease_id)
    assert tier.stats()[KV].pages_used == 0
    with pytest.raises(ValueError, match="lease_id"):
        tier.commit_put(lease.lease_id)


def test_lru_per_kind_evicts_the_chain_tail_first_and_never_a_leased_page(tier):
    first = chain(list(range(24)))  # 6 KV blocks
    put(tier, KV, first)
    snapshots = chain(list(range(100, 116)))  # 4 KDA pages fill the KDA arena
    put(tier, KDA, snapshots)
    tier.take_events()
    reading = tier.begin_get(KV, first[:2])  # blocks 0, 1 leased
    second = chain(list(range(200, 216)))  # 4 more KV blocks: 2 free, 2 evicted
    lease = tier.reserve_put(KV, second)
    assert None not in lease.pages
    tier.commit_put(lease.lease_id)
    evicted = [e.block_hash for e in tier.take_events() if not e.inserted]
    assert evicted == [first[5], first[4]]  # the unleased tail of the older chain, deepest first
    assert tier.match(first, has_state=False).kv_depth == 4
    assert tier.stats()[KDA].evictions == 0 and tier.stats()[KV].evictions == 2
    tier.end_get(reading.lease_id)


def test_a_tier_full_of_leased_pages_answers_no_room(tier):
    hashes = chain(list(range(32)))  # 8 blocks fill the KV arena
    put(tier, KV, hashes)
    reading = tier.begin_get(KV, hashes)
    writing = tier.reserve_put(KV, chain(list(range(300, 308))))
    assert (writing.pages, writing.no_room) == ((None, None), 2)
    assert tier.stats()[KV].evictions == 0
    tier.commit_put(writing.lease_id)  # nothing to commit: a no-op
    tier.end_get(reading.lease_id)


def test_corrupt_page_is_dropped_counted_and_the_get_stops_before_it(tier):
    hashes = chain(list(range(16)))
    put(tier, KV, hashes)
    tier.take_events()
    page = tier.begin_get(KV, hashes[2:3])
    tier.end_get(page.lease_id)
    tier.kv.storage[page.pages[0], 5] ^= 0xFF  # flip one byte of block 2's page
    lease = tier.begin_get(KV, hashes)
    assert (len(lease.pages), lease.checksum_failures) == (2, 1)
    tier.end_get(lease.lease_id)
    assert tier.stats()[KV].checksum_failures == 1
    assert tier.take_events() == [TierEvent(KV, hashes[2], False)]
    assert tier.match(hashes, has_state=False).kv_depth == 2
    assert tier.stats()[KV].pages_used == 3


def test_a_corrupt_page_another_reader_holds_is_dropped_once_it_is_free(tier):
    hashes = chain(list(range(8)))
    put(tier, KV, hashes)
    first = tier.begin_get(KV, hashes)
    tier.kv.storage[first.pages[1], 0] ^= 0x01
    second = tier.begin_get(KV, hashes)
    assert len(second.pages) == 1 and tier.match(hashes, has_state=False).kv_depth == 2  # still held
    tier.end_get(first.lease_id)
    tier.end_get(second.lease_id)
    third = tier.begin_get(KV, hashes)
    assert third.pages == first.pages[:1] and tier.match(hashes, has_state=False).kv_depth == 1
    tier.end_get(third.lease_id)
    assert tier.stats()[KV].checksum_failures == 2


@pytest.mark.parametrize(
    "snapshot_blocks, has_state, usable",
    [((2,), True, 2), ((1, 3), True, 3), ((4,), True, 0), ((), True, 0), ((1,), False, 3)],
    ids=["snapshot-mid", "deepest-within-kv", "snapshot-beyond-kv", "no-snapshot", "no-state-model"],
)
def test_hybrid_rule(tier, snapshot_blocks, has_state, usable):
    hashes = chain(list(range(20)))  # 5 blocks
    put(tier, KV, hashes[:3])
    put(tier, KDA, [hashes[d - 1] for d in snapshot_blocks])
    match = tier.match(hashes, has_state=has_state)
    assert (match.kv_depth, match.snapshot_depths, match.usable_depth) == (3, snapshot_blocks, usable)


def test_tenants_with_the_same_prompt_never_share_pages(tier):
    prompt = list(range(16))
    alice, bob = chain(prompt, tenant="alice"), chain(prompt, tenant="bob")
    assert not set(alice) & set(bob)
    put(tier, KV, alice)
    put(tier, KDA, alice[-1:])
    assert tier.match(bob, has_state=True).kv_depth == 0
    lease = tier.reserve_put(KV, bob)
    assert None not in lease.pages
    tier.abort_put(lease.lease_id)
    miss = tier.begin_get(KV, bob)
    assert miss.pages == ()
    tier.end_get(miss.lease_id)
    assert tier.match(alice, has_state=True).usable_depth == 4


def test_a_model_without_kda_has_no_kda_arena():
    tier = HostTier(KV_PAGE, 0, 2 * KV_PAGE, 0, "fp", pin=False)
    assert tier.kda is None and set(tier.stats()) == {KV}
    with pytest.raises(ValueError, match="kind"):
        tier.reserve_put(KDA, chain(list(range(4))))
    tier.check_integrity()


def test_leases_a_dead_worker_left_expire_and_free_their_pages():
    now = [0.0]
    tier = HostTier(
        KV_PAGE, KDA_PAGE, 4 * KV_PAGE, KDA_PAGE, "fp", pin=False, lease_ttl_s=10, clock=lambda: now[0]
    )
    hashes = chain(list(range(16)))
    put(tier, KV, hashes[:2])
    reading = tier.begin_get(KV, hashes[:2])
    writing = tier.reserve_put(KV, hashes[2:])
    assert tier.reserve_put(KV, chain(list(range(50, 54)))).pages == (None,)  # all leased: no room
    now[0] = 10.5  # the worker died: its leases pass their life
    late = tier.reserve_put(KV, chain(list(range(60, 64))))
    assert late.pages != (None,) and tier.open_leases() == 1
    with pytest.raises(ValueError, match="lease_id: .* expired"):
        tier.commit_put(writing.lease_id)
    with pytest.raises(ValueError, match="lease_id"):
        tier.end_get(reading.lease_id)
    assert tier.match(hashes, has_state=False).kv_depth == 2
    tier.abort_put(late.lease_id)
    tier.check_integrity()


def test_threads_putting_and_getting_never_see_a_page_change_under_a_lease():
    """Checksums run outside the tier's lock: four threads put and get overlapping chains through a
    tier that evicts all the time; every leased page must hold its own hash's bytes throughout."""
    tier = make_tier(kv_pages=6, kda_pages=1)
    chains = [chain(list(range(100 * c, 100 * c + 12))) for c in range(5)]  # 3 blocks each
    failures: list[str] = []

    def content(block_hash: bytes) -> torch.Tensor:
        return torch.frombuffer(bytearray(block_hash * (KV_PAGE // len(block_hash))), dtype=torch.uint8)

    def work(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(150):
            hashes = rng.choice(chains)
            if rng.random() < 0.5:
                lease = tier.reserve_put(KV, hashes)
                for block_hash, page in zip(hashes, lease.pages, strict=True):
                    if page is not None:
                        tier.kv.storage[page] = content(block_hash)
                tier.commit_put(lease.lease_id)
            else:
                lease = tier.begin_get(KV, hashes)
                for block_hash, page in zip(hashes, lease.pages, strict=False):
                    if not torch.equal(tier.kv.storage[page], content(block_hash)):
                        failures.append(f"page {page} does not hold its hash's bytes")
                tier.end_get(lease.lease_id)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: inside the tier's calls too
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert failures == []
    stats = tier.stats()[KV]
    assert stats.evictions > 0 and stats.bytes_out > 0 and stats.checksum_failures == 0
    tier.check_integrity()
    assert tier.open_leases() == 0
