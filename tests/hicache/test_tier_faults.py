"""The node's tier dies and comes back: a client answers misses and no room meanwhile (never an error), logs
the outage once, attaches again to the restarted run (on the same port, as the launcher restarts it), forgets
the leases of the dead run, and the new run holds and finds pages again; a restarted run that another
layout attached to first is refused soft (misses, one log line naming the field), never an error. The
service runs in this process (starting ``baton cache`` twice costs ~10 s); ``test_cache_service.py`` runs
it as the launcher does."""

import logging
import time
from dataclasses import replace

from common.prefix_hash import chain_root, extend_chain
from services.hicache.client import MISS, NO_LEASE, HostCacheClient
from services.hicache.host_tier import KV
from services.hicache.server import CacheConfig, HostCacheServer

KV_PAGE, KDA_PAGE, PAGES = 256, 512, 8
FINGERPRINT = "layout-faults"


def test_a_killed_tier_is_a_miss_then_restarted_on_its_port_and_attached_again(caplog):
    config = CacheConfig(PAGES * KV_PAGE, PAGES * KDA_PAGE, port=0)
    cache = HostCacheServer(config)
    address = f"127.0.0.1:{cache.port}"
    client = HostCacheClient(address, timeout_s=2.0, retry_s=0.2)
    hashes = extend_chain([], list(range(16)), 4, chain_root("model"))
    try:
        assert client.attach(FINGERPRINT, KV_PAGE, KDA_PAGE) is not None and client.epoch == 1
        assert (client.available, client.reconnects) == (True, 0)  # the first attach is no reconnect
        first = client.endpoint()
        put = client.reserve_put(KV, hashes)
        client.commit_put(put.lease_id)
        assert client.match(hashes, has_state=False).kv_depth == 4
        held = client.begin_get(KV, hashes)  # a read in flight when the tier dies
        assert len(held.pages) == 4

        cache.stop(grace_s=0)  # the tier dies with a read lease open
        with caplog.at_level(logging.WARNING, logger="services.hicache.client"):
            assert client.match(hashes, has_state=False) == MISS
            lease = client.reserve_put(KV, hashes)
            assert (lease.lease_id, lease.pages) == (NO_LEASE, (None,) * 4)  # nothing to write
            assert client.begin_get(KV, hashes).pages == ()
            client.end_get(held.lease_id)  # the dead run's lease: nothing to end, no error
        assert [r.message for r in caplog.records if "unreachable" in r.message] == [
            f"host cache {address} unreachable (Match: UNAVAILABLE): answering misses, retrying every 0.2 s"
        ]
        assert (client.available, client.outages, client.skipped_calls) == (False, 1, 4)

        cache = HostCacheServer(replace(config, port=cache.port))  # restarted on its port
        deadline = time.monotonic() + 10
        while not client.available:  # about retry_s (and gRPC's reconnect backoff, kept to it)
            assert client.match(hashes, has_state=False) == MISS  # a new run: its pages are gone
            assert time.monotonic() < deadline, "the client did not attach to the restarted tier"
            time.sleep(0.1)
        assert (client.available, client.epoch) == (True, 2) and client.endpoint() != first
        assert client.reconnects == 1  # baton_hicache_tier_reconnects_total

        put = client.reserve_put(KV, hashes)
        assert None not in put.pages
        client.commit_put(put.lease_id)
        get = client.begin_get(KV, hashes)
        assert get.lease_id & 0xFFFF == held.lease_id & 0xFFFF  # the same number in the new run...
        client.end_get(held.lease_id)  # ...yet ending the dead run's lease leaves it alone
        assert client.stats()[KV].pages_used == 4
        client.end_get(get.lease_id)
        assert client.match(hashes, has_state=False).kv_depth == 4
    finally:
        client.close()
        cache.stop(grace_s=0)


def test_a_tier_full_of_pinned_pages_answers_no_room_not_an_error():
    cache = HostCacheServer(CacheConfig(PAGES * KV_PAGE, 0, port=0))
    client = HostCacheClient(f"127.0.0.1:{cache.port}", timeout_s=2.0)
    try:
        client.attach(FINGERPRINT, KV_PAGE, 0)
        held = extend_chain([], list(range(4 * PAGES)), 4, chain_root("model", tenant="a"))
        client.commit_put(client.reserve_put(KV, held).lease_id)
        readers = client.begin_get(KV, held)  # every page leased by a reader: none can be evicted
        assert len(readers.pages) == PAGES
        other = extend_chain([], list(range(8)), 4, chain_root("model", tenant="b"))
        lease = client.reserve_put(KV, other)
        assert lease.pages == (None, None)  # no room: the worker skips the save
        client.abort_put(lease.lease_id)
        assert client.match(other, has_state=False).kv_depth == 0 and client.available
        client.end_get(readers.lease_id)
        lease = client.reserve_put(KV, other)  # unpinned: the LRU makes room again
        assert None not in lease.pages
        client.commit_put(lease.lease_id)
        assert client.match(other, has_state=False).kv_depth == 2
    finally:
        client.close()
        cache.stop(grace_s=0)


def test_a_restarted_tier_attached_first_by_another_layout_is_a_miss_not_an_error(caplog):
    config = CacheConfig(PAGES * KV_PAGE, PAGES * KDA_PAGE, port=0)
    cache = HostCacheServer(config)
    address = f"127.0.0.1:{cache.port}"
    client = HostCacheClient(address, timeout_s=2.0, retry_s=0.2)
    other = HostCacheClient(address, timeout_s=2.0)
    hashes = extend_chain([], list(range(8)), 4, chain_root("model"))
    try:
        client.attach(FINGERPRINT, KV_PAGE, KDA_PAGE)
        cache.stop(grace_s=0)
        cache = HostCacheServer(replace(config, port=cache.port))  # restarted on its port...
        other.attach("another-model", KV_PAGE, KDA_PAGE)  # ...and attached first by another layout
        with caplog.at_level(logging.ERROR, logger="services.hicache.client"):
            for _ in range(3):  # the run is seen, refused (logged once), asked again after retry_s
                assert client.match(hashes, has_state=False) == MISS
                time.sleep(0.25)
            lease = client.reserve_put(KV, hashes)
            assert (lease.lease_id, lease.pages) == (NO_LEASE, (None,) * 2)  # the save is skipped
            assert client.begin_get(KV, hashes).pages == ()
        refused = [r.message for r in caplog.records if "refused" in r.message]
        assert len(refused) == 1 and "layout_fingerprint: 'layout-faults'" in refused[0], refused
        assert (client.available, client.epoch, client.refusals) == (False, 1, 1)
        assert other.stats()[KV].pages_used == 0  # nothing of this client's reached the other layout's tier
    finally:
        client.close()
        other.close()
        cache.stop(grace_s=0)
