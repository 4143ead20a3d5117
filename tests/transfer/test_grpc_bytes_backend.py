"""What only ``grpc_bytes`` has: chunking, its server's own checks, its metadata, a hung receiver.

Receiver and sender live in this process (the server runs on its own threads); the two-process
scenarios shared with NIXL are in ``test_two_process.py``.
"""

import re
import time

import grpc
import pytest
import torch

from common.errors import TransferError
from proto.baton.v1 import transfer_pb2, transfer_pb2_grpc
from services.transfer import BLOCKS, STATE, Notification, TransferEndpoint
from services.transfer.grpc_bytes_backend import GrpcBytesBackend, _Sink
from tests.transfer.receiver_peer import sentinel

ROWS, ROW_BYTES = 7, 192


@pytest.fixture
def pair():
    """A receiver with a sentinel-filled region and a sender with random rows, connected."""
    receiver, sender = GrpcBytesBackend("decode-g"), GrpcBytesBackend("prefill-g", chunk_bytes=100)
    target = sentinel((ROWS, ROW_BYTES), 1)
    source = torch.randint(
        0, 256, (ROWS, ROW_BYTES), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )
    receiver.register(BLOCKS, target)
    sender.register(BLOCKS, source)
    try:
        yield receiver, sender, target, source
    finally:
        sender.close()
        receiver.close()


def test_endpoint_is_a_local_address(pair):
    receiver, _, target, _ = pair
    endpoint = receiver.endpoint()
    host, port = endpoint.metadata.decode().split(":")
    assert (endpoint.backend, endpoint.agent_name, host) == ("grpc_bytes", "decode-g", "127.0.0.1")
    assert int(port) > 0 and receiver.endpoint() == endpoint  # one server, one port
    assert endpoint.region(BLOCKS).num_rows == ROWS and endpoint.region(BLOCKS).base_addr == target.data_ptr()


def test_chunks_smaller_than_a_row_land_exactly(pair):
    """100-byte chunks split rows of 192 B and a 3-row span; only the target rows change."""
    receiver, sender, target, source = pair
    peer = sender.connect(receiver.endpoint())
    stats = sender.write(peer, {BLOCKS: [(0, 4), (1, 5), (2, 6), (6, 0)]}, message="req-c", timeout_s=10)
    assert stats.nbytes == 4 * ROW_BYTES
    assert receiver.wait_notification("req-c", 5) == Notification("prefill-g", "req-c")
    want = sentinel((ROWS, ROW_BYTES), 1)
    want[4:7], want[0] = source[0:3], source[6]
    assert torch.equal(target, want)


def test_no_message_sends_no_notification(pair):
    receiver, sender, target, source = pair
    peer = sender.connect(receiver.endpoint())
    sender.write(peer, {BLOCKS: [(3, 3)]}, timeout_s=10)
    assert torch.equal(target[3], source[3])
    assert receiver.poll_notifications() == []


def raw_write(receiver: GrpcBytesBackend, requests) -> grpc.RpcError:
    with grpc.insecure_channel(receiver.endpoint().metadata.decode()) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            transfer_pb2_grpc.TransferSinkStub(channel).WriteRows(iter(requests), timeout=5)
    return caught.value


def chunk(region=BLOCKS, first_row=0, row_count=1, byte_offset=0, data=b"x"):
    return transfer_pb2.WriteRowsRequest(
        chunk=transfer_pb2.RowChunk(
            region=region, first_row=first_row, row_count=row_count, byte_offset=byte_offset, data=data
        )
    )


DONE = transfer_pb2.WriteRowsRequest(done=transfer_pb2.WriteDone(sender="rogue", message="bad"))


@pytest.mark.parametrize(
    "requests, error",
    [
        ([chunk(region=STATE), DONE], "no region 'state'"),
        ([chunk(first_row=6, row_count=2), DONE], r"rows 6..7 out of range \[0, 7\)"),
        ([chunk(byte_offset=ROW_BYTES), DONE], "pass the end of 1 rows"),
        ([chunk()], "ended without done"),
        ([DONE, chunk()], "a chunk after done"),
    ],
    ids=["unknown-region", "rows-past-end", "bytes-past-span", "no-done", "chunk-after-done"],
)
def test_server_rejects_malformed_streams(pair, requests, error):
    """The sender never sends these; the server checks anyway and queues no notification."""
    receiver, _, target, _ = pair
    caught = raw_write(receiver, requests)
    assert caught.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert re.search(error, caught.details())
    assert receiver.poll_notifications() == []
    if "out of range" in error or "region" in error:
        assert torch.equal(target, sentinel((ROWS, ROW_BYTES), 1))


@pytest.mark.parametrize("metadata", [b"", b"127.0.0.1", b"host:port"], ids=["empty", "no-port", "bad-port"])
def test_connect_rejects_bad_metadata(metadata):
    with GrpcBytesBackend("prefill-m") as sender:
        with pytest.raises(
            TransferError, match="grpc_bytes: endpoint of 'decode-m' has metadata .*, not HOST:PORT"
        ):
            sender.connect(TransferEndpoint("grpc_bytes", "decode-m", metadata, ()))


def test_bad_chunk_size_is_rejected():
    with pytest.raises(TransferError, match="chunk_bytes must be in"):
        GrpcBytesBackend("x", chunk_bytes=(4 << 20) + 1)


def test_hung_receiver_ends_in_timeout(monkeypatch, pair):
    """A receiver that never answers: the write fails on time, naming the peer."""
    monkeypatch.setattr(_Sink, "WriteRows", lambda self, requests, context: time.sleep(3))
    receiver, sender, _, _ = pair
    peer = sender.connect(receiver.endpoint())
    start = time.monotonic()
    with pytest.raises(
        TransferError, match="peer 'decode-g' at 127.0.0.1:[0-9]+ did not complete before its timeout"
    ):
        sender.write(peer, {BLOCKS: [(0, 0)]}, message="req-h", timeout_s=0.3)
    assert time.monotonic() - start < 2.0
