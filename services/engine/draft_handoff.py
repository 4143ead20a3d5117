"""The draft model's part of a handoff: its prompt rows travel beside the target's.

```
 decode engine (--draft-model)              prefill engine (--draft-model, the same draft)
 reserve: target blocks + slot, and    ──►  the target's prefill as ever; then, when the
   reserve_draft: draft blocks + slot        reservation's draft layout is its own: prefill_draft
   (Reservation.draft, layout.draft)         (the prompt through the draft, into a held seat)
                                            send_state: target rows and draft rows, one write
 draft_arrived: the seat counts the    ◄──  (PrefillResponse.draft_transfer_bytes > 0)
   prompt as computed                       release_held frees the held draft seat too
```
Nothing here is required: a prefill engine without a draft, or with another draft, sends the target's
rows only, and the decode engine's reserved seat then catches up by itself at
the request's first proposal (``DraftModelProposer``), as after a local prefill. Only single-rank
engines speculate, so draft rows are always copied whole, row for row.
"""

from dataclasses import dataclass

import torch

from services.transfer import DRAFT_BLOCKS, DRAFT_STATE, TransferBackend

from .request import Request
from .speculative.draft_model import DraftModelProposer
from .speculative.proposal import DraftProposer


@dataclass(frozen=True)
class DraftLayout:
    """What a draft's rows must share between two engines to mean the same bytes (the target's
    ``HandoffLayout`` already fixes the dtype, KV format and numerics both drafts follow)."""

    model: str  # the draft checkpoint's fingerprint
    block_size: int
    block_layout: str  # ``Layout.fingerprint()`` of one packed draft block
    slot_layout: str  # ``Layout.fingerprint()`` of one draft state slot


@dataclass(frozen=True)
class DraftRows:
    """One request's rows in a draft's pools: the prompt's blocks in order and its KDA state slot."""

    block_ids: tuple[int, ...]
    slot: int


def draft_layout_of(proposer: DraftProposer | None) -> DraftLayout | None:
    """The layout of ``proposer``'s pools; None when it has none to hand off (no draft model)."""
    if not isinstance(proposer, DraftModelProposer):
        return None
    return DraftLayout(
        model=proposer.model_fingerprint,
        block_size=proposer.blocks.block_size,
        block_layout=proposer.blocks.layout.fingerprint(),
        slot_layout=proposer.slots.layout.fingerprint(),
    )


def reserve_draft(proposer: DraftProposer | None, request: Request) -> DraftRows | None:
    """Decode side, at reserve: the request's draft seat with blocks for its prompt (None without a
    draft model). The seat is freed with the request (abort, expiry, finish), like any seat."""
    if not isinstance(proposer, DraftModelProposer):
        return None
    seat = proposer.reserve_seat(request)
    return DraftRows(tuple(seat.block_table), seat.slot)


def reserved_draft(proposer: DraftProposer | None, request_id: str) -> DraftRows | None:
    """The draft rows ``reserve_draft`` holds for a reserved request (None without a draft model)."""
    if not isinstance(proposer, DraftModelProposer):
        return None
    seat = proposer.seats[request_id]
    return DraftRows(tuple(seat.block_table), seat.slot)


def draft_arrived(proposer: DraftProposer | None, request: Request) -> None:
    """Decode side, once the handoff's notification came with draft rows: the request's seat holds
    its prompt's rows and state."""
    if not isinstance(proposer, DraftModelProposer):
        raise ValueError(f"request {request.request_id!r}: draft rows arrived at an engine without a draft")
    proposer.seat_arrived(request.request_id, len(request.prompt_ids))


def prefill_draft(
    proposer: DraftProposer | None, request: Request, wanted: DraftLayout | None
) -> DraftRows | None:
    """Prefill side, once the target's prefill is held: the prompt through the draft into a held seat,
    when the reservation asks for draft rows laid out as this engine's (``wanted``); else None (the
    decode engine's draft then catches up by itself: not an error)."""
    if wanted is None or wanted != draft_layout_of(proposer):
        return None
    seat = proposer.prefill_seat(request)
    return DraftRows(tuple(seat.block_table), seat.slot)


def draft_nbytes(proposer: DraftProposer, rows: DraftRows) -> int:
    """The bytes a handoff writes for ``rows``: every prompt block and the state slot."""
    return len(rows.block_ids) * proposer.blocks.layout.nbytes + proposer.slots.layout.nbytes


def draft_pool_storages(proposer: DraftProposer | None) -> dict[str, torch.Tensor]:
    """A draft model's handoff regions and their storages (none without a draft model)."""
    if not isinstance(proposer, DraftModelProposer):
        return {}
    return {DRAFT_BLOCKS: proposer.blocks.storage, DRAFT_STATE: proposer.slots.storage}


def register_draft_pools(backend: TransferBackend, proposer: DraftProposer | None) -> None:
    """Register a draft model's block and slot pools beside the target's (nothing without one)."""
    for region, storage in draft_pool_storages(proposer).items():
        backend.register(region, storage)


def draft_row_pairs(held: DraftRows | None, reserved: DraftRows | None) -> dict[str, list[tuple[int, int]]]:
    """The ``(local, remote)`` row pairs of a draft's rows for ``TransferBackend.write``: none unless
    both sides have them.

    Raises:
        ValueError: the two sides hold different numbers of prompt blocks.
    """
    if held is None or reserved is None:
        return {}
    if len(held.block_ids) != len(reserved.block_ids):
        raise ValueError(f"{len(held.block_ids)} prefilled draft blocks, {len(reserved.block_ids)} reserved")
    return {
        DRAFT_BLOCKS: list(zip(held.block_ids, reserved.block_ids, strict=True)),
        DRAFT_STATE: [(held.slot, reserved.slot)],
    }
