"""``DecodeWorker`` gRPC servicer: thin ``from_pb`` -> ``EngineService`` -> ``to_pb``.

Who frees a request's room (and when): its ``Reserve`` lease until a ``Decode`` call claims it
(``leases.py``, ``releaser.py``), then that ``Decode`` call: ending it in any way but a finish (cancel,
deadline, the router gone) aborts the request. Cancellation callbacks only queue work
(``EngineService.abort`` / ``free_reservation``), never wait on the engine.

The data plane (``docs/authentication.md``, "KV data plane"): each reservation gets a one-time
capability (``leases.Lease``); ``Decode`` waits for the notification tagged with it, and decodes the
handoff only when that notification came from the sender the router named and the rows hash to the
prefill worker's checksum; otherwise the reservation's rows are not trusted: it is freed and the
request prefilled here from the ``Reserve`` call's fields (``baton_handoff_refused_total{reason}``).
"""

import queue
import time
from concurrent.futures import Future
from dataclasses import replace

from common.errors import TransferError
from common.metrics import Metrics
from common.rpc.callbacks import when_call_ends
from common.sampling_pb import sampling_from_pb
from proto.baton.v1 import generation_pb2, workers_pb2, workers_pb2_grpc
from services.adapter_rpcs import AdapterRpcs
from services.engine.engine_service import EngineService
from services.engine.handoff import handoff_tag, part_tag
from services.engine.scheduler import SampledToken
from services.rpc.convert import delta_to_pb, endpoint_to_pb, layout_from_pb, reservation_to_pb
from services.transfer.inbox import SharedTransfer

from ..fault_delays import NO_FAULTS, FaultDelays
from ..load_feed import LoadFeed
from ..worker_drain import Drain
from ..worker_integrity import integrity_to_pb
from ..worker_stats import StatsBoard
from .leases import LeaseEnd, Leases
from .releaser import ReservationReleaser

_STATE_POLL_S = 0.25  # how often a Decode call waiting for its state checks that its caller is still there


class DecodeServicer(AdapterRpcs, workers_pb2_grpc.DecodeWorkerServicer):
    """Args: the worker's name, its engine, its transfer backend (pools registered), its stats
    snapshot, its metrics, its drain (while draining, Reserve and local prefills are refused; a
    reservation whose state is arriving is still decoded; once the grace period is over, Decode calls
    are refused and running streams end, for the router to move), its load feed (``WatchLoad``), how
    long a Decode call waits for its
    handoff's state, how long a released reservation waits for a handoff that may still be writing
    into it, and the injected fault delays."""

    def __init__(
        self,
        name: str,
        engine: EngineService,
        transfer: SharedTransfer,
        stats: StatsBoard,
        metrics: Metrics,
        drain: Drain,
        load_feed: LoadFeed,
        transfer_timeout_s: float = 60.0,
        release_grace_s: float = 5.0,
        faults: FaultDelays = NO_FAULTS,
    ):
        self.name = name
        self.engine = engine
        self.transfer = transfer
        self.transfer_timeout_s = transfer_timeout_s
        self.stats = stats
        self.metrics = metrics
        self.drain = drain
        self.faults = faults
        self.load_feed = load_feed
        self.leases = Leases()
        self.releaser = ReservationReleaser(engine, transfer, release_grace_s)

    def Reserve(self, request, context):
        if not request.request_id:
            raise ValueError("request_id: required")
        params = sampling_from_pb(request.sampling)
        request_id = request.request_id
        local_limit = (
            request.local_prefill_max_tokens if request.HasField("local_prefill_max_tokens") else None
        )
        sender = None  # the router's chosen prefill worker's layout: refused here if it cannot write
        if request.HasField("prefill_layout"):
            sender = layout_from_pb(request.prefill_layout, "prefill_layout")
        self.faults.pause("reserve")
        with self.drain.admit("Reserve"):
            reserved = self.engine.reserve(
                list(request.prompt_ids),
                params,
                request_id,
                request.tenant,
                resumed_tokens=request.resumed_tokens,
                local_prefill_max_tokens=local_limit,
                adapter=request.adapter,
                prefill_layout=sender,
            )
        if reserved.prefill_locally:
            reservation = workers_pb2.CacheReservation(
                request_id=request_id, cached_tokens=reserved.cached_tokens
            )
            yield workers_pb2.ReserveResponse(reservation=reservation, prefill_locally=True)
            return
        lease = self.leases.open(request_id)
        lease.local = workers_pb2.LocalPrefill(
            prompt_ids=request.prompt_ids,
            sampling=request.sampling,
            tenant=request.tenant,
            resumed_tokens=request.resumed_tokens,
            adapter=request.adapter,
        )
        when_call_ends(context, lambda: self._end_lease(request_id, LeaseEnd.CALLER_GONE))
        if not context.is_active():  # gone before the answer (a 1 ms deadline): nobody can write here
            self._end_lease(request_id, LeaseEnd.CALLER_GONE)
            return
        lease.may_have_reached_caller = True
        yield workers_pb2.ReserveResponse(
            reservation=reservation_to_pb(replace(reserved.reservation, capability=lease.capability)),
            endpoint=endpoint_to_pb(self.transfer.endpoint()),
            rank_endpoints=[endpoint_to_pb(endpoint) for endpoint in self.engine.rank_endpoints],
        )
        lease.wait()  # the stream stays open while the reservation waits for its state

    def _end_lease(self, request_id: str, how: LeaseEnd, handoff_may_be_in_flight: bool | None = None):
        """End a lease and free its reservation (non-blocking: runs in cancellation callbacks).
        Returns the release's ``Future`` when it frees at once, else None."""
        lease = self.leases.end(request_id, how)
        if lease is None:
            return None  # already claimed or ended by someone else
        self.metrics.reservations_freed.labels(how.value).inc()
        if handoff_may_be_in_flight is None:
            handoff_may_be_in_flight = lease.may_have_reached_caller
        tag = handoff_tag(request_id, lease.capability)
        return self.releaser.release(request_id, handoff_may_be_in_flight, tag)

    def expired(self, request_ids: list[str]) -> None:
        """The reservation TTL freed these (loop thread): their Reserve streams end."""
        for request_id in request_ids:
            self.leases.end(request_id, LeaseEnd.EXPIRED)
            self.metrics.reservations_freed.labels(LeaseEnd.EXPIRED.value).inc()

    def Decode(self, request, context):
        request_id = request.request_id
        if not request_id:
            raise ValueError("request_id: required")
        # Past the grace period nothing more starts here; an unclaimed reservation stays with its lease
        # (the router, moving the request, ends it and the releaser frees it).
        self.drain.check_expired(request_id)
        lease = None if request.HasField("local_prefill") else self.leases.end(request_id, LeaseEnd.CLAIMED)
        if not request.HasField("local_prefill") and lease is None:
            raise KeyError(
                f"request_id: {request_id!r} has no reservation here (released, expired or never made)"
            )
        # From here this call owns the request: however it ends, the request goes with it.
        when_call_ends(context, lambda: self.engine.abort(request_id))
        if request.HasField("local_prefill"):
            yield from self._prefill_and_decode(request_id, request.local_prefill, context)
            return
        arrived = self._await_parts(request, lease.capability, context)
        if arrived is None:
            return  # the caller left (the callback above freed the reservation)
        refused = self._refusal(request, *arrived)
        if refused is not None:  # the rows are not the prefill's: free them, prefill here instead
            self.metrics.handoff_refused.labels(refused).inc()
            self.engine.abort(request_id).result()
            yield from self._prefill_and_decode(request_id, lease.local, context)
            return
        first = SampledToken(
            token_id=request.first_token_id,
            logprob=request.first_logprob if request.HasField("first_logprob") else None,
            top_logprobs=[(t.token_id, t.logprob) for t in request.first_top_logprobs] or None,
        )
        self.faults.pause("decode_start")
        stream = self.engine.accept_handoff(request_id, first, with_draft=request.draft_state)
        yield from self._stream(request_id, stream, context)

    def _await_state(self, tag: str, request_id: str, context) -> list[str] | None:
        """Wait for the handoff's notification ``tag``; returns the agents that sent it, or None if the
        caller left meanwhile.

        Raises:
            TransferError: nothing arrived within ``transfer_timeout_s`` (the reservation is freed).
        """
        deadline = time.monotonic() + self.transfer_timeout_s
        while True:
            try:
                return self.transfer.wait(tag, min(_STATE_POLL_S, max(0.0, deadline - time.monotonic())))
            except TransferError:
                if not context.is_active():
                    return None
                if time.monotonic() >= deadline:
                    self.engine.abort(request_id)
                    raise

    def _await_parts(self, request, capability: str, context) -> tuple[list[str], list[Future]] | None:
        """Wait for every part of the handoff (``request.handoff_parts``; 0 or 1: one notification),
        starting each part's hash as it lands (with ``handoff_checksum`` set) while the next arrives.
        Returns the agents that sent the parts and the parts' hashes (``Future``s), or None if the
        caller left meanwhile.

        Raises:
            TransferError: a part did not arrive within ``transfer_timeout_s`` (the reservation is freed).
        """
        request_id, parts = request.request_id, max(1, request.handoff_parts)
        over_spans = request.handoff_checksum_spans  # a parallel handoff: hashed once all of it landed
        hashed = request.HasField("handoff_checksum") and not over_spans
        landing = self.engine.arrived_parts(request_id, request.draft_state) if hashed else []
        senders: list[str] = []
        hashes: list[Future] = []
        for part in range(parts):
            sent_by = self._await_state(part_tag(request_id, capability, part, parts), request_id, context)
            if sent_by is None:
                return None
            senders.extend(sent_by)
            if hashed and len(landing) == parts:  # else the rows here are not the sender's: refused
                hashes.append(self.engine.arrived_checksum(landing[part], capability))
        if over_spans and request.HasField("handoff_checksum"):
            hashes.append(self.engine.landed_checksum(request_id, capability))
        return senders, hashes

    def _refusal(self, request, senders: list[str], hashes: list[Future]) -> str | None:
        """Why the handoff that arrived for ``request`` must not be decoded (a ``handoff_refused``
        reason), or None: a notification from an agent other than the router's named sender
        (``sender``), or rows that do not hash to the prefill worker's checksum (``checksum``: the
        parts' ``hashes`` do not add up to it, or the rows here do not split into its parts)."""
        if request.handoff_sender and any(sender != request.handoff_sender for sender in senders):
            return "sender"
        if request.HasField("handoff_checksum"):
            start = time.perf_counter()  # from the last part's arrival: the check's share of TTFT
            values = [future.result(timeout=self.transfer_timeout_s) for future in hashes]
            self.metrics.handoff_checks.inc()
            self.metrics.handoff_check_seconds.inc(time.perf_counter() - start)
            if (
                len(values) != max(1, request.handoff_parts)
                or sum(values) % (1 << 64) != request.handoff_checksum
            ):
                return "checksum"
        return None

    def _prefill_and_decode(self, request_id: str, local, context):
        """No handoff (or a refused one): this worker prefills the prompt itself (``local``, a
        ``LocalPrefill``), then decodes as usual."""
        params = sampling_from_pb(local.sampling)
        prompt = list(local.prompt_ids)
        with self.drain.admit("Decode with a local prefill"):
            stream = self.engine.generate(
                prompt,
                params,
                request_id,
                local.tenant,
                resumed_tokens=local.resumed_tokens,
                adapter=local.adapter,
            )
        yield from self._stream(request_id, stream, context)

    def _stream(self, request_id: str, stream, context):
        finished = False
        try:
            while True:
                self.drain.check_expired(request_id)  # the grace period is over: the router moves it
                try:
                    delta = stream.get(timeout=1.0)
                except queue.Empty:
                    if not context.is_active():
                        return
                    continue  # queued behind other work, or a long prefill: no token yet
                message = delta_to_pb(delta)
                if delta.finish_reason is not None:
                    message.route.decode_worker = self.name
                    finished = True
                yield message
                if finished:
                    return
        finally:
            # Also when the server drops this generator (its caller left while a message was being
            # sent), or the request was added after the cancellation callback had already run.
            if not finished:
                self.engine.abort(request_id)

    def Release(self, request, context):
        released = self._end_lease(
            request.request_id, LeaseEnd.RELEASED, handoff_may_be_in_flight=not request.no_handoff_in_flight
        )
        if released is not None:
            released.result()  # freed before the answer: the caller may reuse the room at once
        return workers_pb2.ReleaseResponse()

    def Score(self, request, context):
        scored = self.engine.score_prompt(list(request.prompt_ids), request.top_logprobs, request.adapter)
        return workers_pb2.ScoreResponse(
            logprobs=[token.logprob for token in scored],
            top_logprobs=[
                generation_pb2.TokenLogprobs(
                    top=[generation_pb2.TopLogprob(token_id=i, logprob=p) for i, p in token.top_logprobs]
                )
                for token in scored
            ]
            if request.top_logprobs
            else [],
        )

    def Stats(self, request, context):
        return self.stats.latest()

    def WatchLoad(self, request, context):
        return self.load_feed.updates(context)

    def CheckIntegrity(self, request, context):
        return integrity_to_pb(self.name, self.engine.integrity(), leases=len(self.leases))

    def close(self) -> None:
        self.releaser.close()
