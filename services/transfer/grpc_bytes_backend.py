"""The gRPC-bytes transfer backend: row bytes travel inside a gRPC call (no RDMA needed).

The explicit fallback for machines without RDMA, and the baseline NIXL is measured against. The
receiver runs a small ``TransferSink`` server (``proto/baton/v1/transfer.proto``) on 127.0.0.1 and
an OS-chosen port, started by its first ``endpoint()``; the endpoint's metadata is that
``"127.0.0.1:PORT"`` address. A write is one client-streaming ``WriteRows`` call::

    sender                                        receiver (TransferSink server thread)
    chunk(blocks, rows 0.., offset 17*R, <=4 MiB) ──► copy into the region's bytes from 17*R
    chunk(blocks, rows 0.., offset 17*R + 4 MiB)  ──► (a span larger than a chunk is split)
    chunk(state,  rows 0.., offset 5*S, ...)      ──► copy into state row 5
    done(sender, message)                         ──► queue Notification(sender, message)
                                      ack  ◄────────  bytes_written

The ack comes only after every byte is in and the notification is queued, so "notification after
the data" holds, and the sender's ``write`` returns only once the data has landed.
"""

import queue
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import torch

from common.errors import TransferError
from proto.baton.v1 import transfer_pb2, transfer_pb2_grpc

from .backend import Notification, TransferBackend
from .byte_plan import ByteSpan
from .endpoint import RegionInfo, TransferEndpoint

CHUNK_BYTES = 4 << 20  # payload per streamed message
# Room for a full chunk plus its fields on both ends (gRPC's default limit is 4 MiB in total).
_MAX_MESSAGE_BYTES = 2 * CHUNK_BYTES
_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
]
_SERVER_THREADS = 4
_HOST = "127.0.0.1"


class GrpcBytesBackend(TransferBackend):
    """Transfer backend that streams row bytes over gRPC.

    Args:
        agent_name: unique name of this backend (default: ``baton-<random>``).
        chunk_bytes: payload bytes per streamed message, at most ``CHUNK_BYTES`` (tests use small
            chunks so spans split across rows).
    """

    name = "grpc_bytes"

    def __init__(self, agent_name: str | None = None, chunk_bytes: int = CHUNK_BYTES):
        super().__init__(agent_name or f"baton-{uuid.uuid4().hex[:12]}")
        if not 0 < chunk_bytes <= CHUNK_BYTES:
            raise TransferError(f"grpc_bytes: chunk_bytes must be in (0, {CHUNK_BYTES}], got {chunk_bytes}")
        self._chunk_bytes = chunk_bytes
        self._server: grpc.Server | None = None  # started by the first endpoint()
        self._address = ""
        self._inbox: queue.SimpleQueue[Notification] = queue.SimpleQueue()  # filled by server threads
        self._channels: dict[str, tuple[grpc.Channel, transfer_pb2_grpc.TransferSinkStub, str]] = {}

    # ---- receiver ----------------------------------------------------------------------------

    def _register_region(self, info: RegionInfo) -> None:
        pass  # the server looks regions up in self._storages when bytes arrive

    def _metadata(self) -> bytes:
        if self._server is None:
            pool = ThreadPoolExecutor(max_workers=_SERVER_THREADS, thread_name_prefix="grpc-bytes-sink")
            server = grpc.server(pool, options=_CHANNEL_OPTIONS)
            transfer_pb2_grpc.add_TransferSinkServicer_to_server(_Sink(self), server)
            port = server.add_insecure_port(f"{_HOST}:0")
            if port == 0:
                raise TransferError(f"grpc_bytes: could not bind a port on {_HOST}")
            server.start()
            self._server, self._address = server, f"{_HOST}:{port}"
        return self._address.encode()

    def _poll(self) -> list[Notification]:
        fresh = []
        while True:
            try:
                fresh.append(self._inbox.get_nowait())
            except queue.Empty:
                return fresh

    # ---- sender ------------------------------------------------------------------------------

    def _add_peer(self, endpoint: TransferEndpoint) -> None:
        address = endpoint.metadata.decode(errors="replace")
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise TransferError(
                f"grpc_bytes: endpoint of {endpoint.agent_name!r} has metadata {address!r}, not HOST:PORT"
            )
        # Like NIXL's add_remote_agent, connecting does not touch the network; the first write does.
        channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        self._channels[endpoint.agent_name] = (channel, transfer_pb2_grpc.TransferSinkStub(channel), address)

    def _remove_peer(self, peer: str) -> None:
        entry = self._channels.pop(peer, None)
        if entry is not None:
            entry[0].close()

    def _write_spans(
        self, endpoint: TransferEndpoint, spans: list[ByteSpan], message: str | None, deadline: float
    ) -> None:
        peer = endpoint.agent_name
        _, stub, address = self._channels[peer]
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TransferError(f"grpc_bytes: the write to peer {peer!r} did not complete before its timeout")
        try:
            reply = stub.WriteRows(self._requests(endpoint, spans, message), timeout=remaining)
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TransferError(
                    f"grpc_bytes: the write to peer {peer!r} at {address} did not complete before its timeout"
                ) from None
            raise TransferError(
                f"grpc_bytes: the write to peer {peer!r} at {address} failed: {code.name}: {exc.details()}"
            ) from None
        expected = sum(span.nbytes for span in spans)
        if reply.bytes_written != expected:
            raise TransferError(
                f"grpc_bytes: peer {peer!r} acknowledged {reply.bytes_written} bytes, sent {expected}"
            )

    def _read_spans(self, endpoint: TransferEndpoint, spans: list[ByteSpan], deadline: float) -> None:
        raise TransferError("read is not supported by grpc_bytes; use nixl")

    def _requests(
        self, endpoint: TransferEndpoint, spans: list[ByteSpan], message: str | None
    ) -> Iterator[transfer_pb2.WriteRowsRequest]:
        """The streamed messages: every span in chunks of at most ``chunk_bytes``, then ``done``.

        A chunk addresses the remote region's bytes from row 0 (``first_row`` 0 over all its rows), so
        a span need not start or end on a row boundary."""
        for span in spans:
            flat = self._storages[span.local_region].view(-1)[
                span.local_offset : span.local_offset + span.nbytes
            ]
            if flat.device.type != "cpu":
                flat = flat.cpu()
            view = memoryview(flat.numpy())
            remote_rows = endpoint.region(span.remote_region).num_rows
            for offset in range(0, span.nbytes, self._chunk_bytes):
                chunk = transfer_pb2.RowChunk(
                    region=span.remote_region,
                    first_row=0,
                    row_count=remote_rows,
                    byte_offset=span.remote_offset + offset,
                    data=view[offset : offset + self._chunk_bytes].tobytes(),
                )
                yield transfer_pb2.WriteRowsRequest(chunk=chunk)
        done = transfer_pb2.WriteDone(sender=self.agent_name)
        if message is not None:
            done.message = message
        yield transfer_pb2.WriteRowsRequest(done=done)

    # ---- lifetime ----------------------------------------------------------------------------

    def _close(self) -> None:
        for peer in list(self._channels):
            self._remove_peer(peer)
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None


class _Sink(transfer_pb2_grpc.TransferSinkServicer):
    """The receiver's ``TransferSink``: copies chunks into the backend's registered storages."""

    def __init__(self, backend: GrpcBytesBackend):
        self._backend = backend

    def WriteRows(self, request_iterator, context):  # noqa: N802 (gRPC method name)
        written = 0
        for request in request_iterator:
            part = request.WhichOneof("part")
            if part == "chunk":
                try:
                    written += self._store(request.chunk)
                except TransferError as exc:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                continue
            if part != "done":
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, "a WriteRows message with neither chunk nor done"
                )
            done = request.done
            if next(request_iterator, None) is not None:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a chunk after done")
            if done.HasField("message"):
                self._backend._inbox.put(Notification(done.sender, done.message))
            return transfer_pb2.WriteRowsReply(bytes_written=written)
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the write ended without done")

    def _store(self, chunk: transfer_pb2.RowChunk) -> int:
        """Copy one chunk into its rows; returns its byte count. Checks the rows first."""
        storage = self._backend._storages.get(chunk.region)
        if storage is None:
            raise TransferError(f"no region {chunk.region!r} on {self._backend.agent_name!r}")
        num_rows, row_bytes = storage.shape
        end_row = chunk.first_row + chunk.row_count
        if chunk.row_count == 0 or end_row > num_rows:
            raise TransferError(
                f"region {chunk.region!r}: rows {chunk.first_row}..{end_row - 1} out of range [0, {num_rows})"
            )
        start, size = chunk.byte_offset, len(chunk.data)
        if start + size > chunk.row_count * row_bytes:
            raise TransferError(
                f"region {chunk.region!r}: {size} bytes at offset {start} pass the end of "
                f"{chunk.row_count} rows of {row_bytes} B"
            )
        dest = storage[chunk.first_row : end_row].view(-1)[start : start + size]
        source = np.frombuffer(chunk.data, dtype=np.uint8)
        if dest.device.type == "cpu":
            dest.numpy()[:] = source  # one copy; torch.frombuffer would warn on read-only bytes
        else:
            dest.copy_(torch.from_numpy(source.copy()))
        return size
