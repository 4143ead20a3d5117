"""``DecodeWorker`` gRPC servicer: thin ``from_pb`` -> engine loop -> ``to_pb``."""

import queue
import threading

from proto.baton.v1 import workers_pb2, workers_pb2_grpc
from services.engine.engine_loop import EngineLoop
from services.engine.handoff import reservation_of
from services.engine.scheduler import SampledToken
from services.rpc.convert import delta_to_pb, endpoint_to_pb, reservation_to_pb, sampling_from_pb
from services.transfer import TransferError
from services.transfer.inbox import SharedTransfer

from ..worker_drain import Drain
from ..worker_integrity import pool_integrity
from ..worker_stats import StatsBoard


class DecodeServicer(workers_pb2_grpc.DecodeWorkerServicer):
    """Args: the worker's name, its engine loop, its transfer backend (pools registered), its stats
    snapshot and its drain (while draining, Reserve and local prefills are refused; a reservation whose
    state is arriving is still decoded)."""

    def __init__(
        self,
        name: str,
        loop: EngineLoop,
        transfer: SharedTransfer,
        stats: StatsBoard,
        drain: Drain,
        transfer_timeout_s: float = 60.0,
        release_grace_s: float = 5.0,
    ):
        self.name = name
        self.loop = loop
        self.transfer = transfer
        self.transfer_timeout_s = transfer_timeout_s
        self.release_grace_s = release_grace_s
        self.stats = stats
        self.drain = drain

    def Reserve(self, request, context):
        if not request.request_id:
            raise ValueError("request_id: required")
        params = sampling_from_pb(request.sampling)
        prompt = list(request.prompt_ids)
        local_limit = (
            request.local_prefill_max_tokens if request.HasField("local_prefill_max_tokens") else None
        )

        def reserve_or_decline(engine):
            """One loop call (one wait for the running step): look up the prefix, then hold room
            unless the prompt is cheaper to prefill here. Returns ``(reservation, cached tokens)``."""
            if local_limit is not None:
                cached = engine.cached_prefix_tokens(prompt, request.tenant)
                if _prefill_here(len(prompt), cached, local_limit, engine.cache.blocks.block_size):
                    return None, cached
            reserved = engine.reserve(
                prompt, params, request.request_id, request.tenant, resumed_tokens=request.resumed_tokens
            )
            return reservation_of(reserved), 0

        with self.drain.admit("Reserve"):
            reserved, cached = self.loop.call(reserve_or_decline)
        if reserved is None:
            reservation = workers_pb2.CacheReservation(request_id=request.request_id, cached_tokens=cached)
            return workers_pb2.ReserveResponse(reservation=reservation, prefill_locally=True)
        return workers_pb2.ReserveResponse(
            reservation=reservation_to_pb(reserved), endpoint=endpoint_to_pb(self.transfer.endpoint())
        )

    def Decode(self, request, context):
        if request.HasField("local_prefill"):
            yield from self._prefill_and_decode(request, context)
            return
        request_id = request.request_id
        try:
            self.transfer.wait(request_id, self.transfer_timeout_s)
        except Exception:
            self.loop.call(lambda engine: engine.abort(request_id))
            raise
        first = SampledToken(
            token_id=request.first_token_id,
            logprob=request.first_logprob if request.HasField("first_logprob") else None,
            top_logprobs=[(t.token_id, t.logprob) for t in request.first_top_logprobs] or None,
        )

        def start(engine):
            stream = self.loop.watch(engine.scheduler.requests[request_id])
            engine.scheduler.complete_reserved(request_id, first)
            return stream

        stream = self.loop.call(start)
        yield from self._stream(request_id, stream, context)

    def _prefill_and_decode(self, request, context):
        """No handoff: this worker prefills the prompt itself, then decodes as usual."""
        local = request.local_prefill
        if not request.request_id:
            raise ValueError("request_id: required")
        params = sampling_from_pb(local.sampling)
        prompt = list(local.prompt_ids)
        with self.drain.admit("Decode with a local prefill"):
            stream = self.loop.call(
                lambda engine: self.loop.watch(
                    engine.add_request(
                        prompt, params, request.request_id, local.tenant, resumed_tokens=local.resumed_tokens
                    )
                )
            )
        yield from self._stream(request.request_id, stream, context)

    def _stream(self, request_id: str, stream, context):
        context.add_callback(lambda: self.loop.call(lambda engine: engine.abort(request_id)))
        while True:
            self.drain.check_expired(request_id)
            try:
                delta = stream.get(timeout=1.0)
            except queue.Empty:
                if not context.is_active():
                    return  # the callback above has aborted it
                continue  # queued behind other work, or a long prefill: no token yet
            message = delta_to_pb(delta)
            if delta.finish_reason is not None:
                message.route.decode_worker = self.name
            yield message
            if delta.finish_reason is not None:
                return

    def Release(self, request, context):
        request_id = request.request_id
        awaiting_state = self.loop.call(lambda engine: request_id in engine.scheduler.reserved)
        if awaiting_state and not request.no_handoff_in_flight:
            threading.Thread(
                target=self._release_after_handoff, args=(request_id,), name="release", daemon=True
            ).start()
        else:
            self.loop.call(lambda engine: engine.abort(request_id))
        return workers_pb2.ReleaseResponse()

    def _release_after_handoff(self, request_id: str) -> None:
        """Free a reservation a prefill worker may still be writing into: after its notification,
        or after the grace period (the prefill worker stops before writing once it is cancelled)."""
        try:
            self.transfer.wait(request_id, self.release_grace_s)
        except TransferError:
            pass  # nothing arrived: no write is coming
        self.loop.call(lambda engine: engine.abort(request_id))

    def Stats(self, request, context):
        return self.stats.latest()

    def CheckIntegrity(self, request, context):
        return self.loop.call(lambda engine: pool_integrity(self.name, engine))


def _prefill_here(prompt_tokens: int, cached_tokens: int, max_uncached: int, block_size: int) -> bool:
    """Conditional disaggregation: a short uncached remainder, or a full cache hit (every block but
    the last, partial one), is cheaper to prefill here than to hand off."""
    uncached = prompt_tokens - cached_tokens
    return uncached <= max_uncached or (cached_tokens > 0 and uncached <= block_size)
