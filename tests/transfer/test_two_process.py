"""Writes from this process (prefill) into a spawned receiver process (decode), byte-exact, for
every transfer backend (``nixl`` and ``grpc_bytes`` run the same scenarios).

The receiver's pools are filled with a position-dependent sentinel before each write, so a row
written to the wrong place, a partial row, or a stray byte anywhere shows in the comparison.
"""

import time

import numpy as np
import pytest
import torch

from common.errors import TransferError
from services.transfer import BLOCKS, STATE, Notification, known_backends, make_backend
from services.transfer.bandwidth import measure_bandwidth
from services.transfer.byte_plan import ByteSpan
from tests.transfer.receiver_peer import (
    BLOCK_BYTES,
    NUM_BLOCKS,
    NUM_SLOTS,
    SLOT_BYTES,
    ReceiverPeer,
    make_pools,
    sentinel,
)

SENDER = "prefill-test"
STAGING = "staging"
STAGING_BYTES = 1000


@pytest.fixture(scope="module", params=known_backends())
def backend_name(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def receiver(backend_name):
    peer = ReceiverPeer(backend_name, agent_name="decode-test")
    try:
        yield peer
    finally:
        peer.close()


@pytest.fixture(scope="module")
def sender(backend_name, receiver):
    blocks, slots = make_pools()
    generator = torch.Generator().manual_seed(0)
    for storage in (blocks.storage, slots.storage):
        storage.copy_(torch.randint(0, 256, storage.shape, dtype=torch.uint8, generator=generator))
    staging = torch.randint(0, 256, (1, STAGING_BYTES), dtype=torch.uint8, generator=generator)
    backend = make_backend(backend_name, SENDER)
    backend.register(BLOCKS, blocks.storage)
    backend.register(STATE, slots.storage)
    backend.register(STAGING, staging)
    backend.connect(receiver.call("endpoint"))
    try:
        yield backend, blocks.storage.numpy(), slots.storage.numpy(), staging.numpy().reshape(-1)
    finally:
        backend.close()


def expected_after(block_pairs, slot_pairs, source_blocks, source_slots):
    blocks = sentinel((NUM_BLOCKS, BLOCK_BYTES), 1).numpy()
    slots = sentinel((NUM_SLOTS, SLOT_BYTES), 2).numpy()
    for local, remote in block_pairs:
        blocks[remote] = source_blocks[local]
    for local, remote in slot_pairs:
        slots[remote] = source_slots[local]
    return blocks, slots


@pytest.mark.parametrize(
    "block_pairs, slot_pairs",
    [
        ([(0, 11), (5, 2), (12, 7), (3, 0)], [(1, 2)]),
        ([(4, 6), (5, 7), (6, 8), (7, 9)], [(0, 0)]),
        ([(2, 12)], []),
        ([], [(2, 1)]),
        ([], []),
        ([(i, NUM_BLOCKS - 1 - i) for i in range(NUM_BLOCKS)], [(0, 0), (1, 1), (2, 2)]),
    ],
    ids=["scattered", "one-run", "last-block", "state-only", "message-only", "every-row-reversed"],
)
def test_rows_arrive_exactly_with_notification(receiver, sender, block_pairs, slot_pairs):
    backend, source_blocks, source_slots, _ = sender
    request_id = f"req-{len(block_pairs)}-{len(slot_pairs)}-{time.monotonic_ns()}"
    receiver.call("fill")
    stats = backend.write(
        "decode-test", {BLOCKS: block_pairs, STATE: slot_pairs}, message=request_id, timeout_s=20
    )
    assert stats.nbytes == len(block_pairs) * BLOCK_BYTES + len(slot_pairs) * SLOT_BYTES
    assert stats.seconds > 0
    assert receiver.call("wait", request_id, 20.0) == Notification(SENDER, request_id)
    assert receiver.call("poll") == []
    got_blocks, got_slots = receiver.snapshot()
    want_blocks, want_slots = expected_after(block_pairs, slot_pairs, source_blocks, source_slots)
    assert np.array_equal(got_blocks, want_blocks)
    assert np.array_equal(got_slots, want_slots)


@pytest.mark.parametrize(
    "copies, error",
    [
        ({BLOCKS: [(0, 1), (NUM_BLOCKS, 2)]}, "local row 13 out of range"),
        ({BLOCKS: [(0, 1), (1, NUM_BLOCKS)]}, "remote row 13 out of range"),
        ({BLOCKS: [(0, 1)], STATE: [(0, NUM_SLOTS)]}, "remote row 3 out of range"),
        ({BLOCKS: [(0, 1), (1, 1)]}, "remote row 1 is written twice"),
    ],
    ids=["local-block", "remote-block", "remote-slot", "duplicate"],
)
def test_bad_rows_raise_before_any_byte_moves(receiver, sender, copies, error):
    backend, source_blocks, source_slots, _ = sender
    receiver.call("fill")
    with pytest.raises(TransferError, match=error):
        backend.write("decode-test", copies, message="never", timeout_s=20)
    # A later good write's notification is the only one, and only its row changed.
    backend.write("decode-test", {BLOCKS: [(9, 9)]}, message="after", timeout_s=20)
    assert receiver.call("wait", "after", 20.0) == Notification(SENDER, "after")
    assert receiver.call("poll") == []
    got_blocks, got_slots = receiver.snapshot()
    want_blocks, want_slots = expected_after([(9, 9)], [], source_blocks, source_slots)
    assert np.array_equal(got_blocks, want_blocks)
    assert np.array_equal(got_slots, want_slots)


def test_unknown_peer_and_missing_notification(receiver, sender):
    backend, _, _, _ = sender
    with pytest.raises(TransferError, match="unknown peer 'decode-other'"):
        backend.write("decode-other", {BLOCKS: [(0, 0)]}, message="x")
    with pytest.raises(TransferError, match="no notification 'req-none' within"):
        receiver.call("wait", "req-none", 0.2)


# Staging bytes into both pools: across row boundaries, a partial row, a block pool row from a pool row.
BYTE_SPANS = [
    ByteSpan(STAGING, 0, BLOCKS, 3 * BLOCK_BYTES - 10, 50),  # ends of row 2 and start of row 3
    ByteSpan(STAGING, 50, STATE, SLOT_BYTES + 7, 300),
    ByteSpan(STAGING, 600, BLOCKS, 11 * BLOCK_BYTES, 1),
    ByteSpan(BLOCKS, 4 * BLOCK_BYTES, BLOCKS, 7 * BLOCK_BYTES, BLOCK_BYTES),
]


def test_byte_spans_arrive_exactly_with_notification(receiver, sender):
    backend, source_blocks, _, staging = sender
    receiver.call("fill")
    stats = backend.write_bytes("decode-test", BYTE_SPANS, message="bytes", timeout_s=20)
    assert stats.nbytes == sum(span.nbytes for span in BYTE_SPANS)
    assert receiver.call("wait", "bytes", 20.0) == Notification(SENDER, "bytes")
    got_blocks, got_slots = receiver.snapshot()
    want_blocks, want_slots = (array.reshape(-1) for array in expected_after([], [], None, None))
    sources = {STAGING: staging, BLOCKS: source_blocks.reshape(-1)}
    for span in BYTE_SPANS:
        want = want_blocks if span.remote_region == BLOCKS else want_slots
        source = sources[span.local_region][span.local_offset : span.local_offset + span.nbytes]
        want[span.remote_offset : span.remote_offset + span.nbytes] = source
    assert np.array_equal(got_blocks.reshape(-1), want_blocks)
    assert np.array_equal(got_slots.reshape(-1), want_slots)


@pytest.mark.parametrize(
    "spans, error",
    [
        ([ByteSpan(STAGING, STAGING_BYTES - 4, BLOCKS, 0, 5)], "local bytes 996..1001 pass its end"),
        ([ByteSpan(STAGING, 0, STATE, NUM_SLOTS * SLOT_BYTES - 1, 2)], "remote bytes 3263..3265 pass"),
        ([ByteSpan(STAGING, 0, BLOCKS, 10, 20), ByteSpan(STAGING, 0, BLOCKS, 29, 4)], "written twice"),
        ([ByteSpan("nowhere", 0, BLOCKS, 0, 1)], "no local region 'nowhere'"),
        ([ByteSpan(STAGING, 0, "nowhere", 0, 1)], "has no region 'nowhere'"),
        ([ByteSpan(STAGING, -1, BLOCKS, 0, 1)], "must be >= 0"),
    ],
    ids=["local-end", "remote-end", "overlap", "local-region", "remote-region", "negative"],
)
def test_bad_byte_spans_raise_before_any_byte_moves(receiver, sender, spans, error):
    backend, *_ = sender
    receiver.call("fill")
    with pytest.raises(TransferError, match=error):
        backend.write_bytes("decode-test", spans, message="never", timeout_s=20)
    backend.write("decode-test", {}, message="after-bytes", timeout_s=20)
    assert receiver.call("wait", "after-bytes", 20.0) == Notification(SENDER, "after-bytes")
    assert receiver.call("poll") == []
    got_blocks, got_slots = receiver.snapshot()
    want_blocks, want_slots = expected_after([], [], None, None)
    assert np.array_equal(got_blocks, want_blocks) and np.array_equal(got_slots, want_slots)


@pytest.mark.parametrize("dies", ["before-connect", "after-connect"])
def test_dead_peer_fails_within_timeout(backend_name, sender, dies):
    backend, _, _, _ = sender
    peer = ReceiverPeer(backend_name, agent_name=f"decode-dead-{dies}")
    try:
        endpoint = peer.call("endpoint")
        if dies == "after-connect":
            backend.connect(endpoint)
        peer.kill()
        timeout_s = 5.0
        start = time.monotonic()
        with pytest.raises(TransferError, match=f"decode-dead-{dies}") as caught:
            backend.connect(endpoint)
            backend.write(endpoint.agent_name, {BLOCKS: [(0, 0)]}, message="lost", timeout_s=timeout_s)
        elapsed = time.monotonic() - start
        print(f"{dies}: {elapsed:.3f} s: {caught.value}")
        assert elapsed < timeout_s + 2.0
    finally:
        backend.disconnect(f"decode-dead-{dies}")
        peer.close()


def test_measure_bandwidth_reports_both_paths(backend_name):
    results = measure_bandwidth([4096, 1 << 20], backend_name)
    assert [r["size_bytes"] for r in results] == [4096, 1 << 20]
    for result in results:
        assert result["backend"] == backend_name
        assert result["transfer_gbps"] > 0 and result["memcpy_gbps"] > 0
        assert result["ratio"] == pytest.approx(result["transfer_gbps"] / result["memcpy_gbps"])
