"""Protobuf <-> engine conversions (``from_pb`` / ``to_pb``) for the worker servicers; the sampling
message, which the router reads too, is ``common/sampling_pb.py``."""

import dataclasses

from proto.baton.v1 import generation_pb2, workers_pb2
from services.engine.draft_handoff import DraftLayout, DraftRows
from services.engine.engine_loop import RequestDelta
from services.engine.handoff import HandoffLayout, Reservation
from services.engine.parallel.layout import ParallelLayout
from services.transfer import RegionInfo, TransferEndpoint

_FINISH = {
    "stop": generation_pb2.FINISH_REASON_STOP,
    "length": generation_pb2.FINISH_REASON_LENGTH,
    "abort": generation_pb2.FINISH_REASON_ABORT,
}


def delta_to_pb(delta: RequestDelta) -> generation_pb2.GenerateResponse:
    message = generation_pb2.GenerateResponse(
        request_id=delta.request_id,
        token_ids=delta.token_ids,
        logprobs=delta.logprobs,
        top_logprobs=[_top_to_pb(top) for top in delta.top_logprobs],
    )
    if delta.finish_reason is not None:
        message.finish_reason = _FINISH[delta.finish_reason]
        message.usage.prompt_tokens = delta.num_prompt_tokens
        message.usage.completion_tokens = delta.num_generated_tokens
        message.usage.cached_tokens = delta.num_cached_tokens
        message.usage.cached_tokens_host = delta.num_cached_tokens_host
        message.usage.draft_tokens = delta.num_draft_tokens
        message.usage.accepted_draft_tokens = delta.num_accepted_draft_tokens
    return message


def _top_to_pb(top) -> generation_pb2.TokenLogprobs:
    return generation_pb2.TokenLogprobs(
        top=[generation_pb2.TopLogprob(token_id=t, logprob=p) for t, p in top]
    )


def endpoint_to_pb(endpoint: TransferEndpoint) -> workers_pb2.TransferEndpoint:
    return workers_pb2.TransferEndpoint(
        backend=endpoint.backend,
        agent_name=endpoint.agent_name,
        metadata=endpoint.metadata,
        regions=[
            workers_pb2.TransferRegion(
                name=r.name,
                base_address=r.base_addr,
                row_bytes=r.row_bytes,
                num_rows=r.num_rows,
                mem_type=r.mem_type,
                device_id=r.device_id,
            )
            for r in endpoint.regions
        ],
    )


def endpoint_from_pb(message: workers_pb2.TransferEndpoint) -> TransferEndpoint:
    regions = tuple(
        RegionInfo(
            name=r.name,
            base_addr=r.base_address,
            row_bytes=r.row_bytes,
            num_rows=r.num_rows,
            mem_type=r.mem_type,
            device_id=r.device_id,
        )
        for r in message.regions
    )
    return TransferEndpoint(
        backend=message.backend, agent_name=message.agent_name, metadata=message.metadata, regions=regions
    )


def layout_to_pb(layout: HandoffLayout) -> workers_pb2.CacheLayout:
    fields = dataclasses.asdict(layout)
    if fields["draft"] is None:
        del fields["draft"]
    return workers_pb2.CacheLayout(**fields)


def layout_from_pb(message: workers_pb2.CacheLayout, field: str) -> HandoffLayout:
    """A ``CacheLayout`` read back (``field``: its name in the request, for errors); degrees unset: one
    rank."""
    fields = {f.name: getattr(message, f.name) for f in dataclasses.fields(HandoffLayout)}
    fields["parallel"] = ParallelLayout()
    fields["draft"] = None
    if message.HasField("draft"):
        fields["draft"] = DraftLayout(
            **{f.name: getattr(message.draft, f.name) for f in dataclasses.fields(DraftLayout)}
        )
    if message.HasField("parallel"):
        degrees = message.parallel
        try:
            fields["parallel"] = ParallelLayout(
                tp=degrees.tp, dcp=degrees.dcp, pcp=degrees.pcp, pp=degrees.pp, ep=degrees.ep
            )
        except ValueError as error:
            raise ValueError(f"{field}.parallel: {error}") from None
    return HandoffLayout(**fields)


def reservation_to_pb(reservation: Reservation) -> workers_pb2.CacheReservation:
    message = workers_pb2.CacheReservation(
        request_id=reservation.request_id,
        block_ids=reservation.block_ids,
        slot=reservation.slot,
        cached_tokens=reservation.cached_tokens,
        capability=reservation.capability,
    )
    if reservation.layout is not None:
        message.layout.CopyFrom(layout_to_pb(reservation.layout))
    if reservation.draft is not None:
        message.draft_block_ids.extend(reservation.draft.block_ids)
        message.draft_slot = reservation.draft.slot
    return message


def reservation_from_pb(message: workers_pb2.CacheReservation) -> Reservation:
    """A reservation; its layout is None when the message has none (the prefill refuses it then)."""
    if not message.request_id:
        raise ValueError("reservation.request_id: required")
    layout = layout_from_pb(message.layout, "reservation.layout") if message.HasField("layout") else None
    draft = None
    if message.HasField("draft_slot"):
        draft = DraftRows(tuple(message.draft_block_ids), message.draft_slot)
    return Reservation(
        message.request_id,
        tuple(message.block_ids),
        message.slot,
        layout,
        message.cached_tokens,
        draft,
        message.capability,
    )


def adapters_to_pb(adapters) -> workers_pb2.AdapterList:
    """``[LoraAdapter]`` (``EngineService.adapters``) -> ``AdapterList``."""
    return workers_pb2.AdapterList(
        adapters=[
            workers_pb2.AdapterInfo(name=a.name, path=a.path, digest=a.digest, modules=len(a.modules))
            for a in adapters
        ]
    )
