"""``WorkerPool.update`` without worker processes: membership, health callbacks, the prefix index, lazy
channel close, and request threads reading the lists while discovery replaces them."""

import gc
import threading

import grpc
import pytest

from router.worker_pool import WorkerPool

# Nothing listens on port 1: calls fail at once with UNAVAILABLE.
A, B, C = "127.0.0.1:1", "127.0.0.2:1", "127.0.0.3:1"


class Health:
    """Records ``on_health`` calls as ``(role, address, up)``."""

    def __init__(self):
        self.calls = []

    def __call__(self, worker, up):
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
    assert pool.decode_order("session", 1.0) == [] and pool.prefill_order([1, 2], 1.0) == []
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


def test_a_removed_worker_is_forgotten_by_the_prefix_index_and_never_reported_again():
    health = Health()
    pool = WorkerPool([A, B], [C], on_health=health)
    removed, hashes = pool.prefill[0], pool.prefixes.block_hashes(list(range(64)), "")
    pool.prefilled(removed, hashes)
    assert pool.prefixes.match_tokens(A, hashes) == 64
    pool.update([B], [C])
    assert removed.removed and pool.prefixes.match_tokens(A, hashes) == 0
    pool.prefilled(removed, hashes)  # a request that was still prefilling on it finishes
    pool.mark_down(removed)
    assert not pool.check(removed)
    assert pool.prefixes.match_tokens(A, hashes) == 0
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
    assert pool.decode[0] is not first and pool.decode[0].up
    pool.close()


def test_request_threads_read_consistent_lists_while_discovery_updates():
    pool = WorkerPool([], [A], probe_interval_s=0.0)
    errors, done = [], threading.Event()

    def requests():
        while not done.is_set():
            try:
                assert pool.decode_order("session-7", 0.2) == []  # nothing answers: all down
                pool.prefill_order([1, 2, 3], 0.2)
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
