"""``WorkerPool.update`` without worker processes: membership, health callbacks, the prefix index, lazy
channel close, and request threads reading the lists while discovery replaces them.

Nothing answers these addresses, so every worker's load feed fails at once and marks it down; the
health checks below look at joins and removals (``True`` and ``None``) only."""

import gc
import threading

import grpc
import pytest

from proto.baton.v1 import workers_pb2
from router.prefix_index import ChainSalt, PromptHashes
from router.worker_pool import WorkerPool

# Nothing listens on port 1: calls fail at once with UNAVAILABLE.
A, B, C = "127.0.0.1:1", "127.0.0.2:1", "127.0.0.3:1"


class Health:
    """Records ``on_health`` calls as ``(role, address, up)``."""

    def __init__(self):
        self.calls = []

    def __call__(self, worker, up):
        if up is not False:  # its feed failing (asynchronously) marks an unreachable worker down
            self.calls.append((worker.role, worker.address, up))


def closed(channel: grpc.Channel) -> bool:
    try:
        channel.unary_unary("/baton.v1.DecodeWorker/Stats")(b"", timeout=0.2)
    except ValueError:  # "Cannot invoke RPC on closed channel!"
        return True
    except grpc.RpcError:
        return False
    return False


def test_an_empty_pool_is_allowed_and_has_no_decode_order():
    pool = WorkerPool([], [])
    assert pool.prefill == [] and pool.decode == []
    prompt = PromptHashes([1, 2], "")
    assert pool.decode_order("session", 1.0) == [] and pool.prefill_order(prompt, 1.0) == []
    pool.close()


def test_update_adds_keeps_and_removes_workers():
    health = Health()
    pool = WorkerPool([A], [B], on_health=health)
    kept = pool.decode[0]
    pool.update([], [B, C, C])
    assert [w.address for w in pool.prefill] == [] and [w.address for w in pool.decode] == [B, C]
    assert pool.decode[0] is kept, "a kept address keeps its Worker (health, name)"
    assert health.calls == [
        ("prefill", A, True),
        ("decode", B, True),
        ("prefill", A, None),
        ("decode", C, True),
    ]
    pool.close()


def full_picture(block_hashes: list[bytes]) -> workers_pb2.LoadUpdate:
    stats = workers_pb2.WorkerStats(worker="w", block_size=16, free_blocks=100)
    return workers_pb2.LoadUpdate(
        stats=stats, full=True, model_fingerprint="m", prefix_caching=True, inserted=block_hashes
    )


def test_a_removed_worker_is_forgotten_by_the_prefix_index_and_never_reported_again():
    health = Health()
    pool = WorkerPool([A, B], [C], on_health=health)
    removed, prompt = pool.prefill[0], PromptHashes(list(range(64)), "")
    removed.watcher.stop()  # this test plays the feed itself
    removed.up = True
    pool._heard(removed, full_picture(prompt.under(ChainSalt("m", 16))))
    assert pool.prefix_tokens(removed, prompt) == 64
    pool.update([B], [C])
    assert removed.removed and pool.prefix_tokens(removed, prompt) == 0
    pool._heard(removed, full_picture([]))  # a feed message still on its way
    pool.mark_down(removed)
    assert not pool.check(removed)
    assert pool.prefix_tokens(removed, prompt) == 0
    assert health.calls[-1] == ("prefill", A, None), "a removed worker's gauge must stay dropped"
    pool.close()


def test_a_removed_workers_channel_closes_only_when_its_last_user_lets_go():
    pool = WorkerPool([], [A])
    in_flight = pool.decode[0]  # a request still streaming from it holds the Worker
    channel = in_flight.channel
    pool.update([], [])
    gc.collect()
    assert not closed(channel), "closing now would cut the running request"
    del in_flight
    gc.collect()
    assert closed(channel)
    pool.close()


def test_a_worker_removed_and_added_again_is_a_fresh_worker():
    pool = WorkerPool([], [A])
    first = pool.decode[0]
    pool.mark_down(first)
    pool.update([], [])
    pool.update([], [A])
    assert pool.decode[0] is not first and pool.decode[0].down_since != first.down_since
    pool.close()


def test_request_threads_read_consistent_lists_while_discovery_updates():
    pool = WorkerPool([], [A], probe_interval_s=0.0)
    errors, done = [], threading.Event()

    def requests():
        while not done.is_set():
            try:
                assert pool.decode_order("session-7", 0.2) == []  # nothing answers: all down
                pool.prefill_order(PromptHashes([1, 2, 3], ""), 0.2)
            except Exception as error:  # any failure here is the bug
                errors.append(error)
                return

    threads = [threading.Thread(target=requests) for _ in range(4)]
    for thread in threads:
        thread.start()
    for step in range(200):
        pool.update([B] if step % 2 else [], [A, C][: step % 3])
    done.set()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    pool.close()


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_close_closes_the_current_channels(role):
    pool = WorkerPool([A] if role == "prefill" else [], [A] if role == "decode" else [])
    channel = getattr(pool, role)[0].channel
    pool.close()
    assert closed(channel)
