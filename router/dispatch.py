"""One request through the workers: reserve on decode, prefill (there or on a prefill worker), decode.

    router ── Reserve ──▶ decode        room for the prompt's state, or "prefill it here"
           ── Prefill ──▶ prefill ══▶ decode   packed blocks + KDA slot over the transfer backend
           ◀═ Decode stream ═ decode         tokens; the last message has usage and route

Conditional disaggregation: a prompt whose uncached part is short (or a full cache hit on the decode
worker) is prefilled by the decode worker itself. A failed prefill or handoff is retried once on
another prefill worker, then prefilled locally on decode; either way the output is unchanged.
"""

import grpc

from proto.baton.v1 import generation_pb2, workers_pb2
from services.engine.scheduler import NoCapacity
from services.metrics import Metrics
from services.transfer import TransferError

from .worker_pool import Worker, WorkerPool

_STATS_TIMEOUT_S = 5.0
_LOCAL_ALWAYS = 2**32 - 1  # local_prefill_max_tokens that makes every prefill local
DISAGGREGATION_MODES = ("conditional", "always", "never")
_NO_DEADLINE_S = 1e8  # a "time remaining" beyond this means the caller set no deadline
_PREFILL_ATTEMPTS = 2  # prefill workers tried before the decode worker prefills itself
# A decode stream that ends with these lost its worker (killed, restarted, or drained past its grace
# period); the router's own cancellations never reach the loop that sees them.
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
    """

    def __init__(
        self, pool: WorkerPool, metrics: Metrics, disaggregation: str = "conditional", local_prefill_tokens=16
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

        ``request`` is the public ``GenerateRequest`` (sampling, session, tenant); ``context`` the
        caller's gRPC context (deadline, cancellation); ``route`` is filled in as workers are chosen
        (for a caller that ends the stream early); ``resumed_tokens``: the prompt ends with that many
        tokens this request already generated (a migrated request). Closing the generator stops the
        decode worker.

        Raises:
            ValueError, NoCapacity, TimeoutError, TransferError: mapped to status codes by the caller;
            DecodeLost (a TransferError) when the decode stream broke off.
        """
        reserve = workers_pb2.ReserveRequest(
            request_id=request_id,
            prompt_ids=prompt_ids,
            sampling=request.sampling,
            tenant=request.tenant,
            resumed_tokens=resumed_tokens,
        )
        if self.disaggregation == "never":
            reserve.local_prefill_max_tokens = _LOCAL_ALWAYS
        elif self.disaggregation == "conditional":
            reserve.local_prefill_max_tokens = self.local_prefill_tokens
        decode, reserved = self._reserve(reserve, request.session_id, time_left(context))
        context.add_callback(lambda: _release(decode, request_id))
        route.decode_worker = decode.name
        local = workers_pb2.LocalPrefill(
            prompt_ids=prompt_ids,
            sampling=request.sampling,
            tenant=request.tenant,
            resumed_tokens=resumed_tokens,
        )
        if reserved.prefill_locally:
            self.metrics.local_prefills.labels(self._local_reason(len(prompt_ids), reserved)).inc()
            decode_request = workers_pb2.DecodeRequest(request_id=request_id, local_prefill=local)
            cached = reserved.reservation.cached_tokens
        else:
            handoff = self._prefill(reserved, prompt_ids, request, context, resumed_tokens)
            if handoff is None:  # every attempt failed (and returned): decode prefills it itself
                _release(decode, request_id, no_handoff_in_flight=True)
                self.metrics.handoff_fallbacks.labels("decode").inc()
                decode_request = workers_pb2.DecodeRequest(request_id=request_id, local_prefill=local)
                cached = 0
            else:
                prefill, first = handoff
                decode_request = _decode_request(request_id, first)
                route.prefill_worker = prefill.address
                route.transfer_backend = reserved.endpoint.backend
                route.transfer_bytes = first.transfer_bytes
                cached = first.cached_tokens
        call = decode.stub.Decode(decode_request, timeout=time_left(context))
        try:
            for message in call:
                if message.finish_reason:
                    message.route.prefill_worker = route.prefill_worker
                    message.route.transfer_backend = route.transfer_backend
                    message.route.transfer_bytes = route.transfer_bytes
                    message.usage.cached_tokens = max(message.usage.cached_tokens, cached)
                yield message
        except grpc.RpcError as error:
            failure = self._failed(decode, error)
            if error.code() in _LOST_CODES:
                raise DecodeLost(str(failure)) from None
            raise failure from None
        finally:
            call.cancel()  # a no-op once the stream ended; stops the worker when the caller left early

    def _local_reason(self, prompt_tokens: int, reserved) -> str:
        if self.disaggregation == "never":
            return "colocated"
        uncached = prompt_tokens - reserved.reservation.cached_tokens
        return "short_prompt" if uncached <= self.local_prefill_tokens else "cache_hit"

    def _reserve(self, reserve, session_id: str, timeout):
        last_error = None
        for decode in self.pool.decode_order(session_id, _STATS_TIMEOUT_S):
            try:
                return decode, decode.stub.Reserve(reserve, timeout=timeout)
            except grpc.RpcError as error:
                if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    raise ValueError(error.details()) from None
                if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise TimeoutError("deadline passed while reserving on a decode worker") from None
                if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    self.pool.check(decode)
                last_error = error  # full or unreachable: try the next one
        if last_error is not None and last_error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise NoCapacity("every decode worker is full; retry later")
        detail = last_error.details() if last_error is not None else "no decode worker is reachable"
        raise TransferError(f"decode: {detail}")

    def _prefill(self, reserved, prompt_ids, request, context, resumed_tokens: int):
        """``(prefill worker, PrefillResponse)``, or None when every attempt failed."""
        hashes = self.pool.prefixes.block_hashes(prompt_ids, request.tenant)
        candidates = self.pool.prefill_order(hashes, _STATS_TIMEOUT_S)[:_PREFILL_ATTEMPTS]
        prefill_request = workers_pb2.PrefillRequest(
            reservation=reserved.reservation,
            endpoint=reserved.endpoint,
            prompt_ids=prompt_ids,
            sampling=request.sampling,
            tenant=request.tenant,
            resumed_tokens=resumed_tokens,
        )
        for attempt, prefill in enumerate(candidates):
            if attempt:
                self.metrics.handoff_fallbacks.labels("prefill").inc()
            call = prefill.stub.Prefill.future(prefill_request, timeout=time_left(context))
            context.add_callback(call.cancel)  # the client left: the prefill worker stops too
            try:
                first = call.result()
            except grpc.FutureCancelledError:
                raise TransferError("the request was cancelled during its prefill") from None
            except grpc.RpcError as error:
                failure = self._failed(prefill, error)
                if not isinstance(failure, TransferError):
                    raise failure from None  # the request itself is bad, or its time is up
                continue
            self.pool.prefilled(prefill, hashes)
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


def _decode_request(request_id: str, first) -> workers_pb2.DecodeRequest:
    decode_request = workers_pb2.DecodeRequest(
        request_id=request_id,
        first_token_id=first.first_token_id,
        first_top_logprobs=first.first_top_logprobs,
    )
    if first.HasField("first_logprob"):
        decode_request.first_logprob = first.first_logprob
    return decode_request


def _release(decode: Worker, request_id: str, no_handoff_in_flight: bool = False) -> None:
    release = workers_pb2.ReleaseRequest(request_id=request_id, no_handoff_in_flight=no_handoff_in_flight)
    try:
        decode.stub.Release(release, timeout=5)
    except grpc.RpcError:
        pass  # the worker is gone or the request already finished: nothing left to free
