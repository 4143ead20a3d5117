"""The transfer interface: what every backend (NIXL, gRPC bytes, ...) offers the P/D handoff.

The receiver (decode) registers its pools and publishes a ``TransferEndpoint``; the sender (prefill)
registers its own pools, connects to that endpoint and writes rows into it, then the receiver sees
the write's message (the request id) as a ``Notification``::

    decode                                   prefill
    ------                                   -------
    b = make_backend("nixl")                 b = make_backend("nixl")
    b.register("blocks", block_pool.storage) b.register("blocks", block_pool.storage)
    b.register("state", slot_pool.storage)   b.register("state", slot_pool.storage)
    ep = b.endpoint()  ──── gRPC ────────►   peer = b.connect(ep)
                                             b.write(peer, {"blocks": [(3, 17), (4, 18)],
                                                            "state": [(0, 5)]}, message=rid)
    b.wait_notification(rid, timeout_s)  ◄── data first, then the message

``write_bytes`` moves arbitrary byte ranges instead of rows (``byte_plan.ByteSpan``: a local
region's bytes into any region of the peer), with the same up-front checks.

A region is a 2-D contiguous uint8 tensor ``[num_rows, row_bytes]`` (one row = one packed block or
one state slot). This base class owns the checks (regions, peers, row ranges) so every backend fails
the same way *before* moving a byte; backends implement only the ``_hooks``.

A backend object's setup (``register``, ``endpoint``, ``close``) and its notification polling are for
one thread at a time; ``connect`` / ``disconnect`` hold a lock of their own (a parallel prefill
worker's engine thread connects to decode ranks while its handler threads connect for single-rank
handoffs); ``write`` may run on several threads at once once its peer is connected
(``inbox.SharedTransfer`` arranges the rest, and says why each backend allows it).
"""

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from common.errors import TransferError

from .byte_plan import ByteSpan, check_byte_spans
from .endpoint import RegionInfo, TransferEndpoint, region_info
from .row_plan import RowSpan, plan_row_copies

BLOCKS = "blocks"  # the packed-block pool (BlockPool.storage)
STATE = "state"  # the KDA state-slot pool (StateSlotPool.storage)
DRAFT_BLOCKS = "draft_blocks"  # a speculative draft model's packed-block pool (DraftModelProposer.blocks)
DRAFT_STATE = "draft_state"  # the draft model's KDA state-slot pool (DraftModelProposer.slots)


@dataclass(frozen=True)
class TransferStats:
    """What one ``write`` or ``read`` moved: ``nbytes`` payload bytes in ``seconds`` of wall time."""

    nbytes: int
    seconds: float

    @property
    def gbps(self) -> float:
        """Payload gigabytes (1e9 bytes) per second."""
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")


@dataclass(frozen=True)
class Notification:
    """A completed incoming write: ``peer`` (sender's agent name) wrote and sent ``message``."""

    peer: str
    message: str


class TransferBackend(ABC):
    """Registered local regions, connected peers and one-sided row writes into them."""

    name: str = ""

    def __init__(self, agent_name: str):
        self.agent_name = agent_name
        self._regions: dict[str, RegionInfo] = {}
        self._storages: dict[str, torch.Tensor] = {}  # keeps registered memory alive
        self._peers: dict[str, TransferEndpoint] = {}
        self._peers_lock = threading.RLock()  # connect / disconnect from several threads
        self._pending: list[Notification] = []  # polled but not yet claimed by wait_notification
        self._closed = False

    # ---- receiver and sender ----------------------------------------------------------------

    def register(self, region: str, storage: torch.Tensor) -> RegionInfo:
        """Register ``storage`` (``[num_rows, row_bytes]`` contiguous uint8, host or CUDA) as ``region``.

        The tensor is kept referenced until ``close``; it must not be reallocated meanwhile.
        """
        self._check_open()
        if region in self._regions:
            raise TransferError(f"region {region!r} is already registered")
        info = region_info(region, storage)
        self._call(f"register region {region!r}", self._register_region, info)
        self._regions[region] = info
        self._storages[region] = storage
        return info

    def endpoint(self) -> TransferEndpoint:
        """This backend's descriptor for peers (call after registering every region)."""
        self._check_open()
        metadata = self._call("read local metadata", self._metadata)
        return TransferEndpoint(self.name, self.agent_name, metadata, tuple(self._regions.values()))

    # ---- sender ------------------------------------------------------------------------------

    def connect(self, endpoint: TransferEndpoint) -> str:
        """Make ``endpoint`` a writable peer; returns its name for ``write``. Reconnecting replaces it."""
        self._check_open()
        if endpoint.backend != self.name:
            raise TransferError(
                f"endpoint of {endpoint.agent_name!r} is for backend {endpoint.backend!r}, not {self.name!r}"
            )
        with self._peers_lock:
            if endpoint.agent_name in self._peers:
                if self._peers[endpoint.agent_name] == endpoint:
                    return endpoint.agent_name
                self.disconnect(endpoint.agent_name)
            self._call(f"connect to peer {endpoint.agent_name!r}", self._add_peer, endpoint)
            self._peers[endpoint.agent_name] = endpoint
            return endpoint.agent_name

    def disconnect(self, peer: str) -> None:
        """Forget ``peer`` (no error if unknown)."""
        with self._peers_lock:
            if self._peers.pop(peer, None) is not None:
                self._call(f"disconnect peer {peer!r}", self._remove_peer, peer)

    def write(
        self,
        peer: str,
        copies: Mapping[str, Sequence[tuple[int, int]]],
        message: str | None = None,
        timeout_s: float = 30.0,
    ) -> TransferStats:
        """Copy rows into ``peer`` and, once they have landed, deliver ``message`` to it.

        Args:
            peer: a name returned by ``connect``.
            copies: region name -> ``(local_row, remote_row)`` pairs, e.g.
                ``{BLOCKS: [(3, 17), (4, 18)], STATE: [(0, 5)]}``.
            message: delivered to the peer's ``poll_notifications`` after all rows are written
                (typically the request id); ``None`` sends none.
            timeout_s: the whole write must complete within this many seconds.

        Returns:
            ``TransferStats`` with the payload bytes and wall time.

        Raises:
            TransferError: unknown peer or region, row out of range, remote row written twice,
                mismatched row sizes (all checked before any byte moves), backend failure, timeout.
        """
        endpoint = self._peer(peer)
        spans = self._row_bytes(plan_row_copies(self._regions, endpoint, copies))
        return self._write_checked(peer, endpoint, spans, message, timeout_s)

    def write_bytes(
        self, peer: str, spans: Sequence[ByteSpan], message: str | None = None, timeout_s: float = 30.0
    ) -> TransferStats:
        """Copy byte ranges into ``peer`` and, once they have landed, deliver ``message`` to it.

        Args:
            peer: a name returned by ``connect``.
            spans: ``ByteSpan``s (local region and offset -> remote region and offset, size).
            message, timeout_s: as for ``write``.

        Raises:
            TransferError: unknown peer or region, a range outside either side's region, remote bytes
                written twice (all checked before any byte moves), backend failure, timeout.
        """
        endpoint = self._peer(peer)
        return self._write_checked(
            peer, endpoint, check_byte_spans(self._regions, endpoint, spans), message, timeout_s
        )

    def _row_bytes(self, spans: list[RowSpan]) -> list[ByteSpan]:
        """Row spans of same-named regions as the byte spans the backends move."""
        byte_spans = []
        for span in spans:
            row_bytes = self._regions[span.region].row_bytes
            local, remote, nbytes = (
                span.local_row * row_bytes,
                span.remote_row * row_bytes,
                span.count * row_bytes,
            )
            byte_spans.append(ByteSpan(span.region, local, span.region, remote, nbytes))
        return byte_spans

    def _peer(self, peer: str) -> TransferEndpoint:
        self._check_open()
        endpoint = self._peers.get(peer)
        if endpoint is None:
            raise TransferError(f"unknown peer {peer!r} (connected: {sorted(self._peers)})")
        return endpoint

    def _write_checked(
        self,
        peer: str,
        endpoint: TransferEndpoint,
        spans: list[ByteSpan],
        message: str | None,
        timeout_s: float,
    ) -> TransferStats:
        nbytes = sum(span.nbytes for span in spans)
        start = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        self._call(f"write to peer {peer!r}", self._write_spans, endpoint, spans, message, deadline)
        return TransferStats(nbytes, time.perf_counter() - start)

    def read(
        self, peer: str, copies: Mapping[str, Sequence[tuple[int, int]]], timeout_s: float = 30.0
    ) -> TransferStats:
        """Copy rows of ``peer``'s regions into local rows (a one-sided read; the peer sees nothing).

        Args:
            peer: a name returned by ``connect``.
            copies: region name -> ``(local_row, remote_row)`` pairs: the remote row is read into the
                local row of the same-named local region.
            timeout_s: the whole read must complete within this many seconds.

        Returns:
            ``TransferStats`` with the payload bytes and wall time.

        Raises:
            TransferError: unknown peer or region, row out of range, local row read into twice,
                mismatched row sizes (all checked before any byte moves), a backend that cannot read,
                backend failure, timeout.
        """
        endpoint = self._peer(peer)
        spans = self._row_bytes(plan_row_copies(self._regions, endpoint, copies, reading=True))
        nbytes = sum(span.nbytes for span in spans)
        start = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        self._call(f"read from peer {peer!r}", self._read_spans, endpoint, spans, deadline)
        return TransferStats(nbytes, time.perf_counter() - start)

    # ---- receiver ----------------------------------------------------------------------------

    def poll_notifications(self) -> list[Notification]:
        """Notifications of completed incoming writes since the last poll (non-blocking)."""
        self._check_open()
        fresh = self._call("poll notifications", self._poll)
        pending, self._pending = self._pending + fresh, []
        return pending

    def wait_notification(self, message: str, timeout_s: float) -> Notification:
        """Block until a write with ``message`` has completed; other notifications stay queued."""
        deadline = time.monotonic() + timeout_s
        while True:
            polled = self.poll_notifications()
            match = next((n for n in polled if n.message == message), None)
            if match is not None:
                polled.remove(match)
            self._pending = polled + self._pending
            if match is not None:
                return match
            if time.monotonic() >= deadline:
                raise TransferError(f"no notification {message!r} within {timeout_s:.3g} s")
            time.sleep(0.0005)

    # ---- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Disconnect every peer and deregister every region (idempotent)."""
        if self._closed:
            return
        for peer in list(self._peers):
            self.disconnect(peer)
        self._call("close", self._close)
        self._regions.clear()
        self._storages.clear()
        self._closed = True

    def __enter__(self) -> "TransferBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise TransferError(f"{self.name} backend {self.agent_name!r} is closed")

    def _call(self, what: str, fn, *args):
        """Run a backend hook, turning any library error into a TransferError naming ``what``."""
        try:
            return fn(*args)
        except TransferError:
            raise
        except Exception as exc:  # library errors have no common base class
            raise TransferError(f"{self.name}: {what} failed: {type(exc).__name__}: {exc}") from exc

    # ---- backend hooks -----------------------------------------------------------------------

    @abstractmethod
    def _register_region(self, info: RegionInfo) -> None:
        """Make the memory ``info`` describes writable by peers."""

    @abstractmethod
    def _metadata(self) -> bytes:
        """Opaque connection metadata for ``TransferEndpoint.metadata``."""

    @abstractmethod
    def _add_peer(self, endpoint: TransferEndpoint) -> None:
        """Prepare to write into ``endpoint``."""

    @abstractmethod
    def _remove_peer(self, peer: str) -> None:
        """Drop a peer added by ``_add_peer``."""

    @abstractmethod
    def _write_spans(
        self, endpoint: TransferEndpoint, spans: list[ByteSpan], message: str | None, deadline: float
    ) -> None:
        """Copy the validated byte ``spans``, then deliver ``message``; raise if ``time.monotonic()``
        passes ``deadline`` first. ``spans`` may be empty (then only the message is sent)."""

    @abstractmethod
    def _read_spans(self, endpoint: TransferEndpoint, spans: list[ByteSpan], deadline: float) -> None:
        """Copy the validated byte ``spans`` from the peer's regions into the local ones; raise if
        ``time.monotonic()`` passes ``deadline`` first, or ``TransferError`` if this backend cannot read."""

    @abstractmethod
    def _poll(self) -> list[Notification]:
        """New notifications since the last call."""

    @abstractmethod
    def _close(self) -> None:
        """Release every backend resource (regions are still in ``self._regions``)."""
