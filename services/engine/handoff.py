"""The baton handoff: a prefill engine's request state written into a decode engine's reservation.

```
 decode engine                         prefill engine
 reserve(prompt) -> Reservation  ───►  add_prefill_only(prompt); step until it is HELD
   (blocks for the prompt, a slot)     send_state(): packed blocks + KDA slot, row for row,
                                          over a TransferBackend, tagged with the request id
 wait for the notification      ◄───   release_held(request id)
 complete_reserved(first token)        (its blocks stay in its prefix cache)
 decode as usual
```
Both engines must share the block and slot layouts (same model, block size, dtype, KV format and
numerics mode); ``layouts_match`` checks it.
"""

from dataclasses import dataclass

from services.transfer import BLOCKS, STATE, TransferBackend, TransferStats

from .cache_manager import CacheManager
from .request import Request, RequestStatus
from .scheduler import SampledToken


@dataclass(frozen=True)
class Reservation:
    """Where the decode engine wants a request's prompt state: block ids in order, and a slot."""

    request_id: str
    block_ids: tuple[int, ...]
    slot: int


def reservation_of(request: Request) -> Reservation:
    """The reservation a decode engine made for ``request`` (``EngineCore.reserve``)."""
    if request.status is not RequestStatus.RESERVED:
        raise ValueError(f"request {request.request_id!r} is not reserved")
    return Reservation(request.request_id, tuple(request.block_table), request.slot)


def register_pools(backend: TransferBackend, cache: CacheManager) -> None:
    """Register an engine's block and slot memory with a transfer backend (either side)."""
    backend.register(BLOCKS, cache.blocks.storage)
    backend.register(STATE, cache.slots.storage)


def layouts_match(prefill: CacheManager, decode: CacheManager) -> bool:
    """True when rows of one engine's pools mean the same bytes in the other's."""
    return (
        prefill.blocks.layout == decode.blocks.layout
        and prefill.blocks.block_size == decode.blocks.block_size
        and prefill.slots.layout == decode.slots.layout
    )


def send_state(
    backend: TransferBackend, peer: str, request: Request, reservation: Reservation
) -> TransferStats:
    """Write a held prefill request's prompt blocks and KDA slot into ``reservation`` on ``peer``.

    Raises:
        ValueError: the request is not held, or the reservation has a different number of blocks.
        TransferError: the backend failed (named by the backend).
    """
    if request.status is not RequestStatus.HELD:
        raise ValueError(f"request {request.request_id!r} has no held prefill state to send")
    blocks = request.block_table
    if len(blocks) != len(reservation.block_ids):
        raise ValueError(
            f"request {request.request_id!r}: {len(blocks)} prefilled blocks, "
            f"{len(reservation.block_ids)} reserved"
        )
    rows = {
        BLOCKS: list(zip(blocks, reservation.block_ids, strict=True)),
        STATE: [(request.slot, reservation.slot)],
    }
    return backend.write(peer, rows, message=request.request_id)


def first_token(request: Request) -> SampledToken:
    """The token a prefill produced, with its logprobs, to start the decode engine from."""
    return SampledToken(
        token_id=request.output_ids[0],
        logprob=request.logprobs[0] if request.logprobs else None,
        top_logprobs=request.top_logprobs[0] if request.top_logprobs else None,
    )
