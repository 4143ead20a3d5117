"""``PrefillWorker`` gRPC servicer: prefill (``EngineService``), then hand the state to decode over the
transfer backend: row for row between two single-rank engines (the transfer stays outside the engine:
``send_state`` reads a ``HeldPrefill``), else every prefill rank writes its share into the decode ranks
that own it (``EngineService.send_rank_handoff``)."""

import queue
import threading

from common.errors import TransferError
from common.metrics import Metrics
from common.rpc.callbacks import when_call_ends
from common.sampling_pb import sampling_from_pb
from proto.baton.v1 import generation_pb2, workers_pb2, workers_pb2_grpc
from services.adapter_rpcs import AdapterRpcs
from services.engine.engine_service import EngineService
from services.engine.handoff import HeldPrefill, Reservation, handoff_row_pairs, row_for_row, send_state
from services.engine.parallel.group_handoff import sent_checksum as group_sent_checksum
from services.rpc.convert import endpoint_from_pb, reservation_from_pb
from services.transfer import BLOCKS, TransferStats
from services.transfer.inbox import SharedTransfer

from ..fault_delays import NO_FAULTS, FaultDelays
from ..load_feed import LoadFeed
from ..worker_drain import Drain
from ..worker_integrity import integrity_to_pb
from ..worker_stats import StatsBoard


class PrefillServicer(AdapterRpcs, workers_pb2_grpc.PrefillWorkerServicer):
    """Args: the worker's name, its engine, its transfer backend (pools registered), its metrics,
    its stats snapshot, its drain (while draining, new prefills are refused; running ones and their
    handoffs complete), its load feed (``WatchLoad``), how long a prefill may wait for a step, and the
    injected faults (failed handoffs, delays).

    A request's cache here lives only within its ``Prefill`` call: held for the handoff, then freed
    however the call ends (done, failed, cancelled)."""

    def __init__(
        self,
        name: str,
        engine: EngineService,
        transfer: SharedTransfer,
        metrics: Metrics,
        stats: StatsBoard,
        drain: Drain,
        load_feed: LoadFeed,
        step_timeout_s: float = 300.0,
        fail_transfers: int = 0,
        faults: FaultDelays = NO_FAULTS,
        stray_handoff_writes: int = 0,
        handoff_checksum: bool = True,
    ):
        self.name = name
        self.faults = faults
        self.load_feed = load_feed
        self.fail_transfers = fail_transfers  # fault injection: the next N handoffs fail
        self.stray_handoff_writes = stray_handoff_writes  # fault injection: N handoffs get a stray write
        self.handoff_checksum = handoff_checksum  # hash each handoff for the decode worker
        self.metrics = metrics
        self.engine = engine
        self.transfer = transfer
        self.step_timeout_s = step_timeout_s
        self.stats = stats
        self.drain = drain
        self._faults_lock = threading.Lock()

    def Prefill(self, request, context):
        reservation = reservation_from_pb(request.reservation)
        endpoint = endpoint_from_pb(request.endpoint)
        rank_endpoints = tuple(endpoint_from_pb(e) for e in request.rank_endpoints) or (endpoint,)
        for field, given in (("endpoint", endpoint), *(("rank_endpoints", e) for e in rank_endpoints)):
            if given.backend != self.transfer.name:
                raise ValueError(
                    f"{field}.backend: {given.backend!r}, but this worker uses {self.transfer.name!r}"
                )
        params = sampling_from_pb(request.sampling)
        prompt, request_id = list(request.prompt_ids), reservation.request_id
        self.faults.pause("prefill")
        if not context.is_active():  # the router gave up before any work started
            raise TransferError(f"request {request_id!r} was cancelled before its prefill")
        with self.drain.admit("Prefill"):  # refuses a reservation laid out unlike this engine's first
            stream = self.engine.prefill(
                prompt,
                params,
                reservation,
                request.tenant,
                resumed_tokens=request.resumed_tokens,
                adapter=request.adapter,
                decode_endpoints=len(rank_endpoints),
            )
        try:
            # The caller left: stop computing (queued, not awaited: this runs on gRPC's event thread).
            when_call_ends(context, lambda: self.engine.abort(request_id))
            held = self._prefilled(request_id, stream, reservation)
            if not context.is_active():  # the router gave up: write nothing into memory it may have freed
                raise TransferError(f"request {request_id!r} was cancelled before its handoff")
            self.faults.pause("handoff")
            try:
                self._inject_failure()
                rank_bytes: list[int] = []
                checksum, over_spans = None, False
                parts = 0  # a parallel handoff: one notification
                if row_for_row(reservation.layout, self.engine.layout):
                    peer = self.transfer.connect(endpoint)
                    # Hashed on the engine's loop thread while the write runs (both only read the rows).
                    hashing = self.engine.sent_checksum(held, reservation) if self.handoff_checksum else None
                    stats = send_state(self.transfer, peer, held, reservation, self.engine.handoff_row_bytes)
                    parts = stats.parts
                    checksum = hashing.result(timeout=self.step_timeout_s) if hashing else None
                    self._inject_stray_write(peer, held, reservation)
                else:
                    sent = self.engine.send_rank_handoff(
                        held, len(prompt), reservation, rank_endpoints, checksum=self.handoff_checksum
                    )
                    if self.handoff_checksum:  # every rank hashed its writes by where they land
                        checksum, over_spans = group_sent_checksum(sent), True
                    rank_bytes = [report.nbytes for report in sent]
                    stats = TransferStats(sum(rank_bytes), max(report.seconds for report in sent))
            except TransferError:
                self.metrics.transfer_failures.labels(self.transfer.name).inc()
                raise
        finally:  # whatever happened, this worker keeps nothing for the request
            self.engine.discard(request_id)
        self.metrics.transfer_bytes.labels(self.transfer.name).inc(stats.nbytes)
        self.metrics.handoff_draft_bytes.labels(self.transfer.name).inc(held.draft_nbytes)
        self.metrics.handoff_decode_held_tokens.inc(reservation.cached_tokens)
        self.metrics.transfer_seconds.labels(self.transfer.name).inc(stats.seconds)
        first = held.first
        response = workers_pb2.PrefillResponse(
            first_token_id=first.token_id,
            transfer_bytes=stats.nbytes,
            transfer_seconds=stats.seconds,
            cached_tokens=held.num_cached_tokens,
            cached_tokens_host=held.num_cached_tokens_host,
            rank_transfer_bytes=rank_bytes,
            draft_transfer_bytes=held.draft_nbytes,
            sender_agent=self.transfer.endpoint().agent_name,
        )
        if checksum is not None:
            response.handoff_checksum = checksum
            response.handoff_checksum_spans = over_spans
        response.handoff_parts = parts
        if first.logprob is not None:
            response.first_logprob = first.logprob
        for token_id, logprob in first.top_logprobs or ():
            response.first_top_logprobs.append(generation_pb2.TopLogprob(token_id=token_id, logprob=logprob))
        return response

    def _prefilled(self, request_id: str, stream, reservation: Reservation) -> HeldPrefill:
        """The held prefill once it is done (with its draft's rows when ``reservation`` asks for rows
        this worker's draft can fill: ``EngineService.held_prefill``).

        Raises:
            TransferError: it was aborted (its caller left).
            TimeoutError: no step finished within ``step_timeout_s``.
        """
        try:
            deltas = [stream.get(timeout=self.step_timeout_s)]
            while deltas[-1].finish_reason is None:
                deltas.append(stream.get(timeout=self.step_timeout_s))
        except queue.Empty:
            raise TimeoutError(
                f"request {request_id!r}: no prefill step within {self.step_timeout_s} s"
            ) from None
        if deltas[-1].finish_reason == "abort":
            raise TransferError(f"request {request_id!r} was aborted during prefill")
        return self.engine.held_prefill(request_id, reservation)

    def _inject_failure(self) -> None:
        with self._faults_lock:
            if self.fail_transfers <= 0:
                return
            self.fail_transfers -= 1
        raise TransferError(f"{self.name}: injected transfer failure (--fail-transfers)")

    def _inject_stray_write(self, peer: str, held: HeldPrefill, reservation: Reservation) -> None:
        """Fault injection (``--stray-handoff-writes``): after the handoff, write another block of this
        worker's pool over the reservation's first written block, untagged: the bytes of a forged
        write landing after the real one, which the decode worker must refuse."""
        with self._faults_lock:
            if self.stray_handoff_writes <= 0:
                return
            self.stray_handoff_writes -= 1
        written = handoff_row_pairs(held, reservation)[BLOCKS]
        if not written:  # the decode worker held every block: nothing of ours to overwrite there
            return
        source, target = written[0]
        stray = 0 if source != 0 else 1
        self.transfer.write(peer, {BLOCKS: [(stray, target)]}, message=f"stray/{held.request_id}")

    def Stats(self, request, context):
        return self.stats.latest()

    def WatchLoad(self, request, context):
        return self.load_feed.updates(context)

    def CheckIntegrity(self, request, context):
        return integrity_to_pb(self.name, self.engine.integrity())
