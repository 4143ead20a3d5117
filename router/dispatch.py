"""One request through the workers: reserve on decode, prefill (there or on a prefill worker), decode.

    router ── Reserve ──▶ decode        room for the prompt's state, or "prefill it here"
           ── Prefill ──▶ prefill ══▶ decode   packed blocks + KDA slot over the transfer backend
           ◀═ Decode stream ═ decode         tokens; the last message has usage and route

Conditional disaggregation: a prompt whose uncached part is short (or a full cache hit on the decode
worker) is prefilled by the decode worker itself; a prompt short enough that decode would prefill it
anyway (and every prompt when colocated) skips the Reserve round trip and goes with the Decode call.
A failed prefill or handoff is retried once on another prefill worker, then prefilled locally on
decode; either way the output is unchanged. Only pairs whose handoff layouts map are chosen
(``handoff_pairs.py``): a decode worker no prefill worker can write into is skipped, the Reserve carries
the chosen sender's layout (the decode worker refuses one it cannot take), and when no pair maps at all
the request is prefilled on decode (``conditional``) or refused naming the field (``always``).

A request with ``prompt_logprobs`` also has its prompt scored by the decode worker that decodes it
(``DecodeWorker.Score``, sent as soon as that worker is chosen, so it runs while the prompt is prefilled);
the scores go out with the first message.

Every worker call is tied to the client's call (``when_call_ends``: a non-blocking cancel), and the
reservation is a lease: the Reserve stream stays open until the Decode call takes the reservation
over. So a client that leaves at any point, or this process dying, ends every worker call, and the
workers free what the request held (services/decode/leases.py).
"""

import time

import grpc

from common.errors import NoCapacity, TransferError
from common.metrics import Metrics
from common.rpc.callbacks import when_call_ends
from proto.baton.v1 import generation_pb2, workers_pb2

from .admission import Admission
from .handoff_pairs import NoMappablePair, pair_refusal
from .prefix_index import PromptHashes
from .worker_pool import Worker, WorkerPool

_FEED_WAIT_S = 5.0  # how long a request waits for a worker whose load feed has not answered yet
_RELEASE_TIMEOUT_S = 2.0
_LOCAL_ALWAYS = 2**32 - 1  # local_prefill_max_tokens that makes every prefill local
DISAGGREGATION_MODES = ("conditional", "always", "never")
_NO_DEADLINE_S = 1e8  # a "time remaining" beyond this means the caller set no deadline
_PREFILL_ATTEMPTS = 2  # prefill workers tried before the decode worker prefills itself
# A decode stream that ends with these lost its worker (killed, restarted, or drained past its grace
# period). The router cancels the call itself only when the caller has left (``when_call_ends``), which
# the migrator tells apart by the caller's context.
_LOST_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


class DecodeLost(TransferError):
    """The decode worker's stream broke off before its last message; the request may move to another
    decode worker (``router.migration``)."""


class Dispatcher:
    """Runs requests through the worker pool.

    Args:
        pool: the workers.
        metrics: the router's metrics (transfer, fallbacks, local prefills).
        disaggregation: ``conditional`` (short or fully cached prompts prefill on decode), ``always``
            (every prompt is handed off) or ``never`` (colocated: decode workers prefill everything).
            With no prefill worker in the pool (discovery has found none yet), decode prefills.
        local_prefill_tokens: in ``conditional`` mode, the most uncached prompt tokens decode prefills.
        admission: where a request waits while every decode worker is full (None: it fails at once
            with ``NoCapacity``).
    """

    def __init__(
        self,
        pool: WorkerPool,
        metrics: Metrics,
        disaggregation: str = "conditional",
        local_prefill_tokens=16,
        admission: Admission | None = None,
    ):
        if disaggregation not in DISAGGREGATION_MODES:
            raise ValueError(
                f"disaggregation: {disaggregation!r} is not one of {', '.join(DISAGGREGATION_MODES)}"
            )
        if local_prefill_tokens < 0:
            raise ValueError(f"local_prefill_tokens: must be >= 0, got {local_prefill_tokens}")
        self.pool = pool
        self.metrics = metrics
        self.disaggregation = disaggregation
        self.local_prefill_tokens = local_prefill_tokens
        self.admission = admission

    def run(
        self,
        request_id: str,
        prompt_ids: list[int],
        request,
        context,
        route: generation_pb2.Route,
        resumed_tokens: int = 0,
    ):
        """Yield the decode worker's messages for one request; the last carries usage and route.

        ``request_id`` is the router's internal id for the request (unique, unguessable: every worker
        keys the request by it), never the client's label. ``request`` is the public
        ``GenerateRequest`` (sampling, session, tenant); ``context`` the caller's gRPC context
        (deadline, cancellation); ``route`` is filled in as workers are chosen (for a caller that ends
        the stream early); ``resumed_tokens``: the prompt ends with that many tokens this request
        already generated (a migrated request). Closing the generator, or the caller leaving, stops
        every worker call.

        Raises:
            ValueError, NoCapacity, TimeoutError, TransferError: mapped to status codes by the caller;
            DecodeLost (a TransferError) when the decode stream broke off.
        """
        if self._prefills_on_decode(len(prompt_ids)):
            reason = "colocated" if self.disaggregation == "never" else "short_prompt"
            yield from self._run_local(
                request_id, prompt_ids, request, context, route, resumed_tokens, reason
            )
            return
        reserve = workers_pb2.ReserveRequest(
            request_id=request_id,
            prompt_ids=prompt_ids,
            sampling=request.sampling,
            tenant=request.tenant,
            resumed_tokens=resumed_tokens,
            adapter=request.adapter,
        )
        if self.disaggregation == "never":
            reserve.local_prefill_max_tokens = _LOCAL_ALWAYS
        elif self.disaggregation == "conditional":
            reserve.local_prefill_max_tokens = self.local_prefill_tokens
        prompt = PromptHashes(prompt_ids, request.tenant, request.adapter)
        prefills = self.pool.prefill_order(prompt, _FEED_WAIT_S)
        try:
            decode, lease, reserved, senders = self._reserve(reserve, prefills, request.session_id, context)
        except NoMappablePair:
            if self.disaggregation == "always":
                raise
            yield from self._run_local(
                request_id, prompt_ids, request, context, route, resumed_tokens, "no_mappable_prefill"
            )
            return
        try:
            yield from self._run_reserved(
                decode, reserved, senders, request_id, prompt_ids, request, context, route, resumed_tokens
            )
        finally:
            # The lease ended by itself once Decode took the reservation over (or at once, for a local
            # prefill); otherwise this frees the reservation (after any handoff still writing into it).
            lease.cancel()

    def _prefills_on_decode(self, prompt_tokens: int) -> bool:
        """Whether the decode worker would answer any Reserve with "prefill it here": colocated, or a
        prompt no longer than the local limit (its uncached part cannot be longer). Such a request
        skips the Reserve round trip (a declined Reserve holds nothing and checks no room either)."""
        if self.disaggregation == "never":
            return True
        return self.disaggregation == "conditional" and prompt_tokens <= self.local_prefill_tokens

    def _run_local(self, request_id, prompt_ids, request, context, route, resumed_tokens, reason: str):
        """A request the decode worker prefills itself, sent with the Decode call alone (``reason``: the
        local-prefill metric's label)."""
        decode = self._least_loaded_decode(request.session_id)
        route.decode_worker = decode.name
        self.metrics.local_prefills.labels(reason).inc()
        self.pool.assigned(decode, len(prompt_ids))
        local = _local_prefill(prompt_ids, request, resumed_tokens)
        decode_request = workers_pb2.DecodeRequest(request_id=request_id, local_prefill=local)
        scores = _start_score(decode, prompt_ids, request, context)
        yield from self._decode(decode, decode_request, context, route, scores=scores)

    def _least_loaded_decode(self, session_id: str) -> Worker:
        """The decode worker a local request goes to (the session's own first, then by load).

        Raises:
            TransferError: no decode worker takes new work.
        """
        ordered = self.pool.decode_order(session_id, _FEED_WAIT_S)
        if not ordered:
            raise TransferError("decode: no decode worker is reachable")
        return ordered[0]

    def _run_reserved(
        self,
        decode: Worker,
        reserved,
        senders: list[Worker],
        request_id,
        prompt_ids,
        request,
        context,
        route,
        resumed_tokens,
    ):
        route.decode_worker = decode.name
        scores = _start_score(decode, prompt_ids, request, context)  # scored while the prompt is prefilled
        local = _local_prefill(prompt_ids, request, resumed_tokens)
        if reserved.prefill_locally:
            self.metrics.local_prefills.labels(self._local_reason(len(prompt_ids), reserved)).inc()
            decode_request = workers_pb2.DecodeRequest(request_id=request_id, local_prefill=local)
            prefilled = None  # the decode worker computes the prompt: its own usage says what it found
        else:
            handoff = self._prefill(reserved, senders, prompt_ids, request, context, resumed_tokens)
            if handoff is None:  # every attempt failed (and returned): decode prefills it itself
                _release(decode, request_id)
                self.metrics.handoff_fallbacks.labels("decode").inc()
                decode_request = workers_pb2.DecodeRequest(request_id=request_id, local_prefill=local)
                prefilled = None
            else:
                prefill, first = handoff
                decode_request = _decode_request(request_id, first)
                route.prefill_worker = prefill.address
                route.transfer_backend = reserved.endpoint.backend
                route.transfer_bytes = first.transfer_bytes
                prefilled = (first.cached_tokens, first.cached_tokens_host)
        yield from self._decode(decode, decode_request, context, route, prefilled, scores)

    def _decode(
        self,
        decode: Worker,
        decode_request,
        context,
        route,
        prefilled: tuple[int, int] | None = None,
        scores: tuple[list[int], object] | None = None,
    ):
        """The decode worker's stream for ``decode_request``; the last message gets the route. When a
        prefill worker computed the prompt, ``prefilled`` is its ``(cached_tokens, cached_tokens_host)``
        and replaces the decode worker's usage numbers: the prompt tokens nobody computed (the blocks
        the decode worker kept at Reserve saved transfer, not compute). Otherwise the decode worker
        computed it and its own usage stands. ``scores``: the prompt and its running ``Score`` call
        (``_start_score``), whose answer goes into the first message."""
        call = decode.stub.Decode(decode_request, timeout=time_left(context))
        when_call_ends(context, call.cancel)  # the client left: the decode worker frees the request
        try:
            for message in call:
                if scores is not None:
                    self._add_scores(decode, message, *scores)
                    scores = None
                if message.finish_reason:
                    message.route.prefill_worker = route.prefill_worker
                    message.route.transfer_backend = route.transfer_backend
                    message.route.transfer_bytes = route.transfer_bytes
                    if prefilled is not None:
                        message.usage.cached_tokens, message.usage.cached_tokens_host = prefilled
                yield message
        except grpc.RpcError as error:
            failure = self._failed(decode, error)
            if error.code() in _LOST_CODES:
                raise DecodeLost(str(failure)) from None
            raise failure from None
        finally:
            call.cancel()  # a no-op once the stream ended; stops the worker when the caller left early

    def _add_scores(self, decode: Worker, message, prompt_ids: list[int], score_call) -> None:
        """The prompt's ids and its ``Score`` answer into ``message`` (the stream's first).

        Raises:
            ValueError, TimeoutError, TransferError: the Score call failed (as ``_failed`` maps it).
        """
        try:
            scored = score_call.result()
        except grpc.FutureCancelledError:
            raise TransferError("the request was cancelled while its prompt was scored") from None
        except grpc.RpcError as error:
            raise self._failed(decode, error) from None
        message.prompt_token_ids.extend(prompt_ids)
        message.prompt_logprobs.extend(scored.logprobs)
        message.prompt_top_logprobs.extend(scored.top_logprobs)

    def _local_reason(self, prompt_tokens: int, reserved) -> str:
        if self.disaggregation == "never":
            return "colocated"
        uncached = prompt_tokens - reserved.reservation.cached_tokens
        return "short_prompt" if uncached <= self.local_prefill_tokens else "cache_hit"

    def _reserve(self, reserve, prefills: list[Worker], session_id: str, context):
        """``(decode worker, lease call, ReserveResponse, prefill workers that map into it, best first)``
        from ``prefills`` (best first). While every decode worker is full, the request waits in the
        router queue and tries again as room frees, until its deadline.

        Raises:
            NoMappablePair: there are prefill workers, but none maps into a decode worker that takes work.
        """
        started = time.monotonic()
        while True:
            try:
                return self._reserve_once(reserve, prefills, session_id, context)
            except NoCapacity:
                if self.admission is None:
                    raise
                if not context.is_active():
                    raise TransferError("the caller left while waiting for a decode worker") from None
                self.admission.wait_for_capacity(time_left(context), time.monotonic() - started)

    def _reserve_once(self, reserve, prefills: list[Worker], session_id: str, context):
        last_error, refusals, paired = None, [], False
        for decode in self.pool.decode_order(session_id, _FEED_WAIT_S):
            senders = [prefill for prefill in prefills if pair_refusal(prefill.layout, decode.layout) is None]
            if prefills and not senders:
                reason = pair_refusal(prefills[0].layout, decode.layout)
                refusals.append(f"decode worker {decode.address}: {reason}")
                continue
            paired = True
            reserve.ClearField("prefill_layout")
            if senders and senders[0].layout is not None:
                reserve.prefill_layout.CopyFrom(senders[0].layout)  # the decode worker checks it
            # The reservation lives while this stream is open: cancelling it (the caller left, or the
            # request ended before decoding) frees it on the worker, and so does this process dying.
            lease = decode.stub.Reserve(reserve, timeout=time_left(context))
            when_call_ends(context, lease.cancel)
            try:
                reserved = next(lease)
                self.pool.assigned(decode, len(reserve.prompt_ids))
                return decode, lease, reserved, senders
            except StopIteration:
                last_error = None  # the worker ended the lease unanswered: it is stopping
                self.pool.check(decode)
                continue
            except grpc.RpcError as error:
                if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise ValueError(error.details()) from None
                if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise TimeoutError("deadline passed while reserving on a decode worker") from None
                if error.code() == grpc.StatusCode.CANCELLED and not context.is_active():
                    raise TransferError("the caller left while reserving on a decode worker") from None
                if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    self.pool.check(decode)
                last_error = error  # full or unreachable: try the next one
        if last_error is not None and last_error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise NoCapacity("every decode worker is full; retry later")
        if refusals and not paired:
            raise NoMappablePair(
                "prefill_layout: no prefill worker can hand off into any decode worker ("
                + "; ".join(refusals)
                + "); serve the two roles with layouts that map (docs/parallel.md)"
            )
        detail = last_error.details() if last_error is not None else "no decode worker is reachable"
        raise TransferError(f"decode: {detail}")

    def _prefill(self, reserved, senders: list[Worker], prompt_ids, request, context, resumed_tokens: int):
        """``(prefill worker, PrefillResponse)`` from the first of ``senders`` that succeeds, or None
        when every attempt failed."""
        candidates = senders[:_PREFILL_ATTEMPTS]
        prefill_request = workers_pb2.PrefillRequest(
            reservation=reserved.reservation,
            endpoint=reserved.endpoint,
            rank_endpoints=reserved.rank_endpoints,
            prompt_ids=prompt_ids,
            sampling=request.sampling,
            tenant=request.tenant,
            resumed_tokens=resumed_tokens,
            adapter=request.adapter,
        )
        for attempt, prefill in enumerate(candidates):
            if attempt:
                self.metrics.handoff_fallbacks.labels("prefill").inc()
            self.pool.assigned(prefill, len(prompt_ids))
            call = prefill.stub.Prefill.future(prefill_request, timeout=time_left(context))
            when_call_ends(context, call.cancel)  # the client left: the prefill worker stops too
            try:
                first = call.result()
            except grpc.FutureCancelledError:
                raise TransferError("the request was cancelled during its prefill") from None
            except grpc.RpcError as error:
                failure = self._failed(prefill, error)
                if not isinstance(failure, TransferError):
                    raise failure from None  # the request itself is bad, or its time is up
                if not context.is_active():
                    raise failure from None  # the caller left: no other attempt
                continue
            self.metrics.transfer_bytes.labels(reserved.endpoint.backend).inc(first.transfer_bytes)
            self.metrics.transfer_seconds.labels(reserved.endpoint.backend).inc(first.transfer_seconds)
            return prefill, first
        return None

    def _failed(self, worker: Worker, error: grpc.RpcError) -> Exception:
        """The exception a worker's failed call becomes; a worker that stopped answering is marked down."""
        code, detail = error.code(), error.details()
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return ValueError(detail)
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return TimeoutError(f"deadline passed in the {worker.role} worker")
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return NoCapacity(detail)
        if code == grpc.StatusCode.CANCELLED:
            return TransferError(f"{worker.role} worker {worker.address}: call cancelled")
        self.pool.check(worker)
        return TransferError(f"{worker.role} worker {worker.address} failed: {detail}")


def time_left(context) -> float | None:
    """Seconds to the caller's deadline, or None without one (gRPC then reports ~9e18 s, which as a
    timeout on an outgoing call would overflow into an immediate DEADLINE_EXCEEDED)."""
    remaining = context.time_remaining()
    return None if remaining is None or remaining > _NO_DEADLINE_S else remaining


def _start_score(decode: Worker, prompt_ids: list[int], request, context) -> tuple[list[int], object] | None:
    """With ``prompt_logprobs``: ``(prompt_ids, the decode worker's running Score call)``, else None."""
    if not request.HasField("prompt_logprobs"):
        return None
    score = workers_pb2.ScoreRequest(
        prompt_ids=prompt_ids,
        tenant=request.tenant,
        adapter=request.adapter,
        top_logprobs=request.prompt_logprobs,
    )
    call = decode.stub.Score.future(score, timeout=time_left(context))
    when_call_ends(context, call.cancel)
    return prompt_ids, call


def _local_prefill(prompt_ids: list[int], request, resumed_tokens: int) -> workers_pb2.LocalPrefill:
    return workers_pb2.LocalPrefill(
        prompt_ids=prompt_ids,
        sampling=request.sampling,
        tenant=request.tenant,
        resumed_tokens=resumed_tokens,
        adapter=request.adapter,
    )


def _decode_request(request_id: str, first) -> workers_pb2.DecodeRequest:
    decode_request = workers_pb2.DecodeRequest(
        request_id=request_id,
        first_token_id=first.first_token_id,
        first_top_logprobs=first.first_top_logprobs,
        draft_state=first.draft_transfer_bytes > 0,  # the draft's rows came too: it need not catch up
        handoff_sender=first.sender_agent,  # decode accepts the handoff from this agent only...
        handoff_parts=first.handoff_parts,  # ...once every part of it has landed...
    )
    if first.HasField("first_logprob"):
        decode_request.first_logprob = first.first_logprob
    if first.HasField("handoff_checksum"):  # ...and only rows that hash to what it sent
        decode_request.handoff_checksum = first.handoff_checksum
        decode_request.handoff_checksum_spans = first.handoff_checksum_spans  # (a parallel handoff's)
    return decode_request


def _release(decode: Worker, request_id: str) -> None:
    """Free a reservation no handoff can still be writing into (every attempt has returned)."""
    release = workers_pb2.ReleaseRequest(request_id=request_id, no_handoff_in_flight=True)
    try:
        decode.stub.Release(release, timeout=_RELEASE_TIMEOUT_S)
    except grpc.RpcError:
        pass  # the worker is gone (its memory with it), or the lease has already ended
