"""``DecodeWorker`` gRPC servicer: thin ``from_pb`` -> engine loop -> ``to_pb``."""

from proto.baton.v1 import workers_pb2, workers_pb2_grpc
from services.engine.engine_loop import EngineLoop
from services.engine.handoff import reservation_of
from services.engine.scheduler import SampledToken
from services.rpc.convert import delta_to_pb, endpoint_to_pb, reservation_to_pb, sampling_from_pb
from services.transfer.inbox import SharedTransfer

from ..worker_stats import worker_stats


class DecodeServicer(workers_pb2_grpc.DecodeWorkerServicer):
    """Args: the worker's name, its engine loop, and its transfer backend (pools registered)."""

    def __init__(
        self, name: str, loop: EngineLoop, transfer: SharedTransfer, transfer_timeout_s: float = 60.0
    ):
        self.name = name
        self.loop = loop
        self.transfer = transfer
        self.transfer_timeout_s = transfer_timeout_s

    def Reserve(self, request, context):
        if not request.request_id:
            raise ValueError("request_id: required")
        params = sampling_from_pb(request.sampling)
        prompt = list(request.prompt_ids)
        reserved = self.loop.call(
            lambda engine: reservation_of(engine.reserve(prompt, params, request.request_id, request.tenant))
        )
        return workers_pb2.ReserveResponse(
            reservation=reservation_to_pb(reserved), endpoint=endpoint_to_pb(self.transfer.endpoint())
        )

    def Decode(self, request, context):
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
        context.add_callback(lambda: self.loop.call(lambda engine: engine.abort(request_id)))
        while True:
            delta = stream.get(timeout=self.transfer_timeout_s)
            message = delta_to_pb(delta)
            if delta.finish_reason is not None:
                message.route.decode_worker = self.name
            yield message
            if delta.finish_reason is not None:
                return

    def Release(self, request, context):
        self.loop.call(lambda engine: engine.abort(request.request_id))
        return workers_pb2.ReleaseResponse()

    def Stats(self, request, context):
        return self.loop.call(lambda engine: worker_stats(self.name, engine))
