"""``baton cache`` in its own process: workers attach, write pages with their own NIXL agent, another
worker finds and reads them back bitwise; layouts and bad fields refused; stats and metrics move; killed,
the launcher's supervisor restarts it on its port and a worker attaches again and moves pages over NIXL."""

import argparse
import time
import urllib.request

import pytest
import torch

from cli import cache_command
from common.prefix_hash import chain_root, extend_chain
from deploy.local.launcher import ManagedCache
from deploy.local.supervisor import Supervisor
from services.hicache.client import EPOCH_SHIFT, MISS, NO_LEASE, HostCacheClient
from services.hicache.host_tier import KDA, KV
from services.hicache.port import HostTierPort
from services.transfer import BLOCKS, STATE, make_backend

KV_PAGE, KDA_PAGE = 256, 512
KV_PAGES, KDA_PAGES = 8, 4
GIB = 1 << 30
FINGERPRINT = "layout-test"


@pytest.fixture(scope="module")
def cache_process():
    """``baton cache`` in its own process, started as ``baton serve`` starts it."""
    cache = ManagedCache(kv_gib=KV_PAGES * KV_PAGE / GIB, kda_gib=KDA_PAGES * KDA_PAGE / GIB)
    cache.start(ready_timeout_s=120)
    try:
        assert cache.ready["role"] == "cache"
        yield cache
    finally:
        cache.stop()
    assert cache.process.returncode == 0


@pytest.fixture(scope="module")
def service(cache_process):
    return cache_process.address, int(cache_process.ready["metrics_port"])


def scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()


class Worker:
    """A worker's side: fake "device" pools in host memory, its own NIXL agent, a client."""

    def __init__(self, name: str, address: str, seed: int):
        generator = torch.Generator().manual_seed(seed)
        self.blocks = torch.randint(0, 256, (6, KV_PAGE), dtype=torch.uint8, generator=generator)
        self.state = torch.randint(0, 256, (2, KDA_PAGE), dtype=torch.uint8, generator=generator)
        self.backend = make_backend("nixl", name)
        self.backend.register(BLOCKS, self.blocks)
        self.backend.register(STATE, self.state)
        self.client = HostCacheClient(address)
        self.peer = self.backend.connect(self.client.attach(FINGERPRINT, KV_PAGE, KDA_PAGE))

    def close(self) -> None:
        self.client.close()
        self.backend.close()


def test_pages_written_by_one_worker_are_read_back_bitwise_by_another(service):
    address, metrics_port = service
    hashes = extend_chain([], list(range(16)), 4, chain_root("model", tenant="t"))  # 4 blocks
    writer, reader = Worker("hc-writer", address, seed=1), Worker("hc-reader", address, seed=2)
    try:
        assert isinstance(writer.client, HostTierPort)
        kv = writer.client.reserve_put(KV, hashes)
        snapshot = writer.client.reserve_put(KDA, hashes[-1:])
        assert None not in kv.pages and None not in snapshot.pages
        writer.backend.write(writer.peer, {BLOCKS: list(zip(range(4), kv.pages, strict=True))})
        writer.backend.write(writer.peer, {STATE: [(1, snapshot.pages[0])]})
        assert reader.client.match(hashes, has_state=True).usable_depth == 0  # not committed yet
        writer.client.commit_put(kv.lease_id)
        writer.client.commit_put(snapshot.lease_id)

        match = reader.client.match(hashes, has_state=True)
        assert (match.kv_depth, match.snapshot_depths, match.usable_depth) == (4, (4,), 4)
        reader.client.record_lookup(kv_hits=0, kv_misses=4, kda_hits=0, kda_misses=1)  # the first match
        reader.client.record_lookup(kv_hits=4, kv_misses=0, kda_hits=1, kda_misses=0)  # this one
        blocks = reader.client.begin_get(KV, hashes)
        state = reader.client.begin_get(KDA, hashes[-1:])
        reader.backend.read(reader.peer, {BLOCKS: [(5 - i, page) for i, page in enumerate(blocks.pages)]})
        reader.backend.read(reader.peer, {STATE: [(0, state.pages[0])]})
        reader.client.end_get(blocks.lease_id)
        reader.client.end_get(state.lease_id)
        assert torch.equal(reader.blocks[2:6].flip(0), writer.blocks[:4])
        assert torch.equal(reader.state[0], writer.state[1])

        stats = reader.client.stats()
        assert (stats[KV].pages_used, stats[KV].bytes_in, stats[KV].bytes_out) == (
            4,
            4 * KV_PAGE,
            4 * KV_PAGE,
        )
        assert (stats[KDA].pages_used, stats[KDA].hits, stats[KDA].misses) == (1, 1, 1)
        wanted = ['baton_hicache_pages_used{kind="kv"} 4.0', 'baton_hicache_hits_total{kind="kda"} 1.0']
        wanted.append(f'baton_hicache_bytes_total{{direction="out",kind="kda"}} {float(KDA_PAGE)}')
        deadline = time.monotonic() + 10  # refreshed every second
        while not all(line in scrape(metrics_port) for line in wanted):
            assert time.monotonic() < deadline, scrape(metrics_port)
            time.sleep(0.2)
    finally:
        writer.close()
        reader.close()


def test_a_different_layout_and_bad_fields_are_refused_naming_the_field(service):
    address, _ = service
    client = HostCacheClient(address)
    try:
        client.attach(FINGERPRINT, KV_PAGE, KDA_PAGE)
        with pytest.raises(ValueError, match="layout_fingerprint: 'other'"):
            client.attach("other", KV_PAGE, KDA_PAGE)
        with pytest.raises(ValueError, match="kda_page_bytes: 64 is not this tier's 512"):
            client.attach(FINGERPRINT, KV_PAGE, 64)
        with pytest.raises(ValueError, match="kind: 'blocks'"):
            client.reserve_put("blocks", [bytes(32)])
        with pytest.raises(ValueError, match="hashes: entry 1 is 3 bytes"):
            client.match([bytes(32), b"abc"], has_state=False)
        with pytest.raises(ValueError, match="lease_id: 12345"):  # a lease of this run the tier never gave
            client.end_get(client.epoch << EPOCH_SHIFT | 12345)
    finally:
        client.close()


def test_an_unreachable_tier_answers_misses_and_no_room():
    client = HostCacheClient("127.0.0.1:1", timeout_s=1.0)
    assert client.attach(FINGERPRINT, KV_PAGE, KDA_PAGE) is None
    assert client.match([bytes(32)], has_state=False) == MISS
    lease = client.reserve_put(KV, [bytes(32)])
    assert (lease.lease_id, lease.pages) == (NO_LEASE, (None,))
    client.commit_put(lease.lease_id)  # skipped: nothing was reserved
    assert (client.available, client.outages, client.skipped_calls) == (False, 1, 2)
    client.close()


@pytest.mark.parametrize(
    "flags, error",
    [
        (["--kv-gib", "0"], "--kv-gib: must be > 0"),
        (["--kv-gib", "1", "--kda-gib", "-1"], "--kda-gib: must be >= 0"),
    ],
    ids=["no-kv", "negative-kda"],
)
def test_cache_command_flags_name_the_flag(flags, error):
    parser = argparse.ArgumentParser()
    cache_command.register(parser.add_subparsers())
    with pytest.raises(ValueError, match=error):
        cache_command.config_from(parser.parse_args(["cache", *flags]))


def test_a_killed_tier_is_restarted_on_its_port_and_a_worker_attaches_again(cache_process, service):
    """Last in the file: the tier it leaves is a new run (what the fixture then stops)."""
    address, _ = service
    worker = Worker("hc-survivor", address, seed=3)
    hashes = extend_chain([], list(range(8)), 4, chain_root("model", tenant="restart"))
    supervisor = Supervisor([cache_process], ready_timeout_s=120, interval_s=0.1)
    supervisor.start()
    try:
        port, first = cache_process.port, worker.client.endpoint()
        cache_process.process.kill()  # SIGKILL: no drain, its pages and leases gone
        deadline = time.monotonic() + 120
        while worker.client.epoch < 2:
            assert worker.client.match(hashes, has_state=False) == MISS  # never an error meanwhile
            assert time.monotonic() < deadline, "the worker did not attach to the restarted tier"
            time.sleep(0.2)
        assert (cache_process.restarts, cache_process.port) == (1, port)
        assert worker.client.outages == 1 and worker.client.endpoint() != first
        worker.peer = worker.backend.connect(worker.client.endpoint())  # the new run's NIXL agent
        put = worker.client.reserve_put(KV, hashes)
        worker.backend.write(worker.peer, {BLOCKS: list(zip((0, 1), put.pages, strict=True))})
        worker.client.commit_put(put.lease_id)
        get = worker.client.begin_get(KV, hashes)
        worker.backend.read(worker.peer, {BLOCKS: list(zip((4, 5), get.pages, strict=True))})
        worker.client.end_get(get.lease_id)
        assert torch.equal(worker.blocks[4:6], worker.blocks[0:2])
    finally:
        supervisor.stop()
        worker.close()
