"""The router's prefill choice with HiCache's cluster index: a prefix in the worker's device pool beats
the same prefix in its node's tier, which beats none; tier hits count only up to their deepest KDA
snapshot. Unit level: workers with fake loads (no feeds, no processes), a fake index, then the real
``ClusterIndex`` on a redis-server (and that server killed: device-pool scoring only, no error)."""

import time

import pytest

from common.cluster_index import KDA, KV, ClusterIndex, IndexEvent, IndexMatch, usable_depth
from deploy.local.redis_server import RedisServer
from proto.baton.v1 import workers_pb2
from router.prefix_index import ChainSalt, PromptHashes
from router.worker_pool import TIER_HIT_WEIGHT, Load, Worker, WorkerPool

BLOCK = 16
SALT = ChainSalt("model", BLOCK)
PROMPT = PromptHashes(list(range(100, 100 + 4 * BLOCK)), "tenant")
HASHES = PROMPT.under(SALT)


class FakeIndex:
    """``ClusterIndex.lookup`` over fixed ``{node: (kv_depth, snapshot_depths)}``; counts its calls."""

    def __init__(self, held: dict[str, tuple[int, tuple[int, ...]]]):
        self.held = held
        self.lookups = []

    def lookup(self, hashes, has_state):
        self.lookups.append(list(hashes))
        return {
            node: IndexMatch(depth, snaps, usable_depth(depth, snaps, has_state))
            for node, (depth, snaps) in self.held.items()
        }


def pool_of(index, has_state: bool = True, device: dict[str, int] | None = None) -> WorkerPool:
    """Prefill workers ``d`` (on node ``node-d``), ``t`` (``node-t``), ``n`` (``node-n``), all idle;
    ``device``: blocks of the prompt each holds in its device pool."""
    pool = WorkerPool([], [], cluster_index=index, has_state=has_state)
    workers = []
    for name in ("n", "t", "d"):  # listed worst first: the order below is the scores', not the list's
        stats = workers_pb2.WorkerStats(worker=name, block_size=BLOCK, node=f"node-{name}")
        worker = Worker("prefill", name, stub=None, channel=None, name=name, load=Load.from_pb(stats))
        pool.prefixes.reset(name, SALT, HASHES[: (device or {}).get(name, 0)])
        workers.append(worker)
    pool.prefill = workers
    return pool


def order(pool: WorkerPool) -> list[str]:
    return [worker.address for worker in pool.prefill_order(PROMPT, 0.1)]


def test_load_carries_the_workers_node():
    assert Load.from_pb(workers_pb2.WorkerStats(node="node-7")).node == "node-7"


def test_device_pool_beats_node_tier_beats_nothing():
    index = FakeIndex({"node-t": (2, (2,))})
    pool = pool_of(index, device={"d": 2})
    assert order(pool) == ["d", "t", "n"]
    assert index.lookups == [HASHES], "one lookup for the one salt, with the prompt's chain"


def test_a_tier_hit_counts_only_up_to_its_deepest_snapshot():
    # node-t holds all 4 blocks but a snapshot only under the first; node-n 2 blocks, snapshot at 2.
    index = FakeIndex({"node-t": (4, (1,)), "node-n": (2, (2,))})
    assert order(pool_of(index, device={"d": 3})) == ["d", "n", "t"]
    # A model without KDA state uses the whole KV run: node-t's 4 blocks now beat node-n's 2.
    assert order(pool_of(index, has_state=False, device={"d": 3})) == ["d", "t", "n"]


def test_tier_blocks_beyond_the_device_hit_add_at_the_tier_weight():
    # d: 1 block on device + its tier's 4 (usable 4): 16 + 0.5 * 48 = 40 tokens > t's device 2 blocks.
    index = FakeIndex({"node-d": (4, (4,))})
    pool = pool_of(index, device={"d": 1, "t": 2})
    assert TIER_HIT_WEIGHT == 0.5 and order(pool) == ["d", "t", "n"]
    # A queue on d worth more than its tier hit sends the prompt elsewhere.
    pool.prefill[2].load = Load(block_size=BLOCK, node="node-d", queued_prompt_tokens=64)
    assert order(pool)[0] == "t"


def test_scoring_through_a_real_index_and_redis_going_away(prefix):
    try:
        server = RedisServer().start()
    except FileNotFoundError as error:
        pytest.skip(f"{error}")
    tier = ClusterIndex(server.url, "node-t", prefix=prefix)
    reader = ClusterIndex(server.url, prefix=prefix)
    reader.link.retry_s = 60.0  # once down, stays off for this test: no retry on the request path
    try:
        events = [IndexEvent(KV, h, True) for h in HASHES] + [IndexEvent(KDA, HASHES[3], True)]
        assert tier.publish(events)
        pool = pool_of(reader, device={"d": 1})
        assert order(pool) == ["t", "d", "n"]  # t: 4 tier blocks at half weight = 32 tokens > d's 16
        server.stop()
        started = time.monotonic()
        assert order(pool)[0] == "d"  # device-pool scoring only: t and n tie at 0 (rotating)
        assert not reader.link.up and time.monotonic() - started < 2  # failed soft, and fast
    finally:
        server.stop()
