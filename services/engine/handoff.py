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
Both engines must share the block and slot layouts: the decode engine's reservation carries its
``HandoffLayout`` (model, block size, dtype, KV format, numerics mode, the two layout fingerprints
and its parallel degrees) and the prefill engine refuses one that differs from its own
(``check_layout``) before computing anything. When either engine has several ranks, the rank-local
fields (block size, layout fingerprints) may differ: each prefill rank then sends its bytes to the
decode ranks that own them (``parallel/rank_handoff.py``, by ``parallel/handoff_plan.py``'s plan,
which refuses a pair it cannot map).

With a draft model on both sides the draft's prompt rows go in the same write (``draft_handoff.py``);
a draft layout that differs is no error: the draft's rows are then simply not sent.

The decode worker gives each reservation a one-time ``capability`` (random, never reused): the write's
notification is tagged with it (``handoff_tag``), and the decode worker accepts only that tag, from the
sender the router named, and only when the bytes that arrived hash to what the prefill worker sent
(``handoff_checksum.py``, keyed by the capability: ``sent_checksum`` / ``arrived_checksum``).

A row-for-row handoff is written in parts of about ``PART_BYTES`` (``handoff_parts``: contiguous slices
of its rows, the same on both sides), each write with its own notification (``part_tag``; the last
part's is the handoff's tag), so the decode worker hashes part ``k`` while part ``k + 1`` lands and only
the last part's hash stays between the write and the first decode step. The parts' checksums add up to
the whole handoff's (their words keep the whole handoff's numbering).
"""

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from services.transfer import BLOCKS, DRAFT_BLOCKS, DRAFT_STATE, STATE, TransferBackend, TransferStats

from .cache_manager import CacheManager
from .draft_handoff import (
    DraftLayout,
    DraftRows,
    draft_layout_of,
    draft_nbytes,
    draft_pool_storages,
    draft_row_pairs,
    prefill_draft,
    reserved_draft,
)
from .engine_core import EngineCore
from .handoff_checksum import REGIONS, rows_checksum
from .parallel.layout import ParallelLayout
from .request import Request, RequestStatus
from .scheduler import SampledToken
from .speculative.proposal import DraftProposer


@dataclass(frozen=True)
class HandoffLayout:
    """What rows of one engine's pools must share with the other's to mean the same bytes there."""

    block_size: int
    dtype: str  # the model dtype (``bfloat16``, ``float32``, ...)
    kv_format: str  # ``auto`` or ``fp8``
    block_layout: str  # ``Layout.fingerprint()`` of one packed block
    slot_layout: str  # ``Layout.fingerprint()`` of one state slot
    numerics: str  # ``default`` or ``batch_invariant`` (CF-BI keeps open-chunk rows in the slot)
    model: str  # the engine's model fingerprint (also the prefix-cache salt)
    parallel: ParallelLayout = ParallelLayout()  # the engine's ranks (block_size: one rank's pool's)
    draft: DraftLayout | None = None  # the draft model's pools (None: no draft); never refused

    @property
    def single_rank(self) -> bool:
        return self.parallel.world_size == 1


# Fields that describe one rank's pools: equal row for row only between two single-rank engines.
_RANK_LOCAL = ("block_size", "block_layout", "slot_layout", "parallel")
_OPTIONAL = ("draft",)  # rows a handoff sends only when both sides agree on them


@dataclass(frozen=True)
class Reservation:
    """Where the decode engine wants a request's prompt state: block ids in order, a slot, and the
    layout those rows have (None only where the sender did not say). ``cached_tokens``: the leading
    prompt tokens whose blocks the decode engine already holds (its own prefix hit, from its device
    pool or its host tier; a multiple of its block's tokens): the handoff writes only the blocks after
    them, and the KDA slot whole. ``draft``: the decode engine's draft seat for the prompt (None
    without a draft model), written only by a prefill engine whose draft has ``layout.draft``."""

    request_id: str
    block_ids: tuple[int, ...]
    slot: int
    layout: HandoffLayout | None = None
    cached_tokens: int = 0
    draft: DraftRows | None = None
    capability: str = ""  # the decode worker's one-time token for this reservation ("": none given)


def handoff_tag(request_id: str, capability: str) -> str:
    """The notification message of a handoff into a reservation: its request id and capability."""
    return f"{request_id}/{capability}" if capability else request_id


PART_BYTES = 16 << 20  # a row-for-row handoff is written in parts of about this many bytes


@dataclass(frozen=True)
class HandoffPart:
    """A contiguous slice of a handoff's rows (regions in ``handoff_checksum.REGIONS`` order), and the
    index of its first 32-bit word in the whole handoff's checksum numbering."""

    rows: dict[str, list]
    start_word: int


def handoff_parts(
    rows: Mapping[str, Sequence], row_bytes: Mapping[str, int], part_bytes: int
) -> list[HandoffPart]:
    """Split a handoff's rows (by region: row ids, or ``(prefill row, decode row)`` pairs) into parts of
    at most ``part_bytes`` (a row larger than that is a part of its own); ``row_bytes``: each region's
    row size. Both sides split their own rows of a row-for-row handoff alike (same regions, counts and
    row sizes)."""
    parts: list[HandoffPart] = []
    current: dict[str, list] = {}
    size = word = start = 0
    for region in REGIONS:
        for row in rows.get(region, ()):
            if size and size + row_bytes[region] > part_bytes:
                parts.append(HandoffPart(current, start))
                current, size, start = {}, 0, word
            current.setdefault(region, []).append(row)
            size += row_bytes[region]
            word += row_bytes[region] // 4
    parts.append(HandoffPart(current, start))
    return parts


def part_tag(request_id: str, capability: str, part: int, parts: int) -> str:
    """The notification of part ``part`` of ``parts``: the last one's is the handoff's tag."""
    tag = handoff_tag(request_id, capability)
    return tag if part == parts - 1 else f"{tag}#{part}"


@dataclass(frozen=True)
class SentState(TransferStats):
    """What ``send_state`` wrote: the bytes and seconds of all its parts, and how many parts."""

    parts: int = 1


@dataclass(frozen=True)
class HeldPrefill:
    """What a prefill engine keeps for a request's handoff: its prompt blocks, its slot and the first
    token (a copy: the engine may free the request once the handoff is done); ``draft``: its draft's
    held prompt rows when the reservation asked for them and this engine could fill them, and
    ``draft_nbytes`` their size."""

    request_id: str
    block_ids: tuple[int, ...]
    slot: int
    first: SampledToken
    num_cached_tokens: int
    num_cached_tokens_host: int = 0  # of ``num_cached_tokens``, loaded from the host tier
    draft: DraftRows | None = None
    draft_nbytes: int = 0


def layout_of(engine: EngineCore) -> HandoffLayout:
    """``engine``'s handoff layout (fixed for its life)."""
    blocks, slots = engine.cache.blocks, engine.cache.slots
    return HandoffLayout(
        block_size=blocks.block_size,
        dtype=str(engine.model.dtype).removeprefix("torch."),
        kv_format=engine.config.kv_format,
        block_layout=blocks.layout.fingerprint(),
        slot_layout=slots.layout.fingerprint(),
        numerics="batch_invariant" if engine.config.batch_invariant else "default",
        model=engine.model_fingerprint,
        parallel=engine.config.layout,
        draft=draft_layout_of(engine.proposer),
    )


def check_layout(decode: HandoffLayout | None, prefill: HandoffLayout) -> None:
    """Refuse a handoff between engines whose rows differ (before any prefill work). Between two
    single-rank engines every field must match (rows are copied whole); when either has several ranks
    only the model and its bytes' meaning must (dtype, KV format, numerics): the plan maps the ranks'
    pools (``handoff_plan.check_mappable`` checks the rest).

    Raises:
        ValueError: no layout, or the first field that differs, naming both sides, e.g.
            ``reservation.layout.dtype: decode worker has float16, this prefill worker has bfloat16``.
    """
    if decode is None:
        raise ValueError(
            "reservation.layout: required (the decode worker did not say how its rows are laid out)"
        )
    whole_rows = row_for_row(decode, prefill)
    for field in dataclasses.fields(HandoffLayout):
        if field.name in _OPTIONAL or (field.name in _RANK_LOCAL and not whole_rows):
            continue
        theirs, ours = getattr(decode, field.name), getattr(prefill, field.name)
        if theirs != ours:
            raise ValueError(
                f"reservation.layout.{field.name}: decode worker has {theirs}, this prefill worker has {ours}"
            )


def check_decode_hit(reservation: Reservation, num_prompt_tokens: int) -> None:
    """Refuse a reservation whose ``cached_tokens`` (the decode engine's own hit, which the handoff
    skips) is not whole decode blocks of the prompt, leaving at least its last token to send.

    Raises:
        ValueError: naming ``reservation.cached_tokens``.
    """
    layout, cached = reservation.layout, reservation.cached_tokens
    block_tokens = layout.block_size * layout.parallel.dcp  # a DCP group's block id covers dcp blocks
    whole_blocks = cached % block_tokens == 0 and cached // block_tokens <= len(reservation.block_ids)
    if not whole_blocks or cached >= num_prompt_tokens:
        raise ValueError(
            f"reservation.cached_tokens: {cached} is not a whole number of the decode worker's "
            f"{block_tokens}-token blocks below the prompt's {num_prompt_tokens} tokens"
        )


def row_for_row(decode: HandoffLayout, prefill: HandoffLayout) -> bool:
    """Whether a handoff copies whole rows (two single-rank engines, ``send_state``) rather than each
    prefill rank its share (``parallel/group_handoff.py``)."""
    return decode.single_rank and prefill.single_rank


def reservation_of(
    request: Request, layout: HandoffLayout | None = None, draft: DraftRows | None = None
) -> Reservation:
    """The reservation a decode engine made for ``request`` (``EngineCore.reserve``), with its layout
    and its draft seat's rows (``draft_handoff.reserve_draft``)."""
    if request.status is not RequestStatus.RESERVED:
        raise ValueError(f"request {request.request_id!r} is not reserved")
    return Reservation(
        request.request_id, tuple(request.block_table), request.slot, layout, request.num_cached_tokens, draft
    )


def held_prefill(request: Request) -> HeldPrefill:
    """The handoff data of a prefill engine's held ``request`` (``add_prefill_only``, then steps).

    Raises:
        ValueError: the request is not held.
    """
    if request.status is not RequestStatus.HELD:
        raise ValueError(f"request {request.request_id!r} has no held prefill state to send")
    return HeldPrefill(
        request.request_id,
        tuple(request.block_table),
        request.slot,
        first_token(request),
        request.num_cached_tokens,
        request.num_cached_tokens_host,
    )


def held_prefill_for(engine: EngineCore, request_id: str, reservation: Reservation | None) -> HeldPrefill:
    """``held_prefill`` of ``engine``'s held request, with its draft's prompt rows computed now into a
    held seat (freed by ``release_held``) when ``reservation`` asks for draft rows laid out as this
    engine's draft (``draft_handoff.prefill_draft``); without them when it cannot.

    Raises:
        KeyError: nothing held for ``request_id``.
    """
    request = engine.scheduler.held[request_id]
    held = held_prefill(request)
    asked = reservation is not None and reservation.draft is not None and reservation.layout is not None
    rows = prefill_draft(engine.proposer, request, reservation.layout.draft if asked else None)
    if rows is None:
        return held
    return dataclasses.replace(held, draft=rows, draft_nbytes=draft_nbytes(engine.proposer, rows))


def register_pools(
    backend: TransferBackend, cache: CacheManager, proposer: DraftProposer | None = None
) -> None:
    """Register an engine's block and slot memory with a transfer backend (either side), and its draft
    model's beside them when ``proposer`` has one."""
    for region, storage in pool_storages(cache, proposer).items():
        backend.register(region, storage)


def send_state(
    backend: TransferBackend,
    peer: str,
    held: HeldPrefill,
    reservation: Reservation,
    row_bytes: Mapping[str, int],
) -> SentState:
    """Write a held prefill's prompt blocks and KDA slot into ``reservation`` on ``peer``: the blocks
    after the reservation's ``cached_tokens`` (the decode engine holds the ones before), the slot whole;
    with ``held.draft`` and ``reservation.draft``, the draft's prompt blocks and slot in the same
    handoff. One write per part (``handoff_parts`` of ``PART_BYTES`` by ``row_bytes``, this engine's
    ``handoff_row_bytes``), each notified with its ``part_tag``. ``backend`` is a ``TransferBackend`` or
    anything with its ``write`` (``SharedTransfer``).

    Raises:
        ValueError: the reservation has a different number of blocks.
        TransferError: the backend failed (named by the backend).
    """
    parts = handoff_parts(handoff_row_pairs(held, reservation), row_bytes, PART_BYTES)
    nbytes, seconds = 0, 0.0
    for index, part in enumerate(parts):
        tag = part_tag(held.request_id, reservation.capability, index, len(parts))
        stats = backend.write(peer, part.rows, message=tag)
        nbytes, seconds = nbytes + stats.nbytes, seconds + stats.seconds
    return SentState(nbytes, seconds, len(parts))


def handoff_row_pairs(held: HeldPrefill, reservation: Reservation) -> dict[str, list[tuple[int, int]]]:
    """The ``(prefill row, decode row)`` pairs a row-for-row handoff writes, by region: the blocks after
    the reservation's ``cached_tokens``, the slot, the draft's rows when both sides have them.

    Raises:
        ValueError: the reservation has a different number of blocks.
    """
    if len(held.block_ids) != len(reservation.block_ids):
        raise ValueError(
            f"request {held.request_id!r}: {len(held.block_ids)} prefilled blocks, "
            f"{len(reservation.block_ids)} reserved"
        )
    held_by_decode = reservation.cached_tokens and reservation.cached_tokens // reservation.layout.block_size
    return {
        BLOCKS: list(zip(held.block_ids, reservation.block_ids, strict=True))[held_by_decode:],
        STATE: [(held.slot, reservation.slot)],
        **draft_row_pairs(held.draft, reservation.draft),
    }


def pool_storages(cache: CacheManager, proposer: DraftProposer | None) -> dict[str, torch.Tensor]:
    """Each handoff region's storage in one engine (as ``register_pools`` registers them)."""
    return {BLOCKS: cache.blocks.storage, STATE: cache.slots.storage, **draft_pool_storages(proposer)}


def handoff_row_bytes(cache: CacheManager, proposer: DraftProposer | None) -> dict[str, int]:
    """Each handoff region's row size in one engine (what ``handoff_parts`` splits by)."""
    return {region: storage.shape[1] for region, storage in pool_storages(cache, proposer).items()}


def sent_checksum(engine: EngineCore, held: HeldPrefill, reservation: Reservation) -> int:
    """Prefill side: the checksum of the rows ``send_state`` wrote (``handoff_checksum.rows_checksum``
    under the reservation's capability)."""
    pairs = handoff_row_pairs(held, reservation)
    rows = {region: [local for local, _ in pair] for region, pair in pairs.items()}
    return rows_checksum(pool_storages(engine.cache, engine.proposer), rows, reservation.capability)


def arrived_parts(engine: EngineCore, request_id: str, with_draft: bool) -> list[HandoffPart]:
    """Decode side: the parts of the rows a handoff into the reserved ``request_id`` writes (the blocks
    after its own prefix hit, its slot, and with ``with_draft`` its draft seat's rows), split as the
    prefill side splits its own (``handoff_parts``).

    Raises:
        KeyError: no such reservation.
    """
    request = engine.scheduler.reserved[request_id]
    held_by_decode = request.num_cached_tokens // engine.cache.block_tokens
    rows = {BLOCKS: request.block_table[held_by_decode:], STATE: [request.slot]}
    draft = reserved_draft(engine.proposer, request_id) if with_draft else None
    if draft is not None:
        rows.update({DRAFT_BLOCKS: list(draft.block_ids), DRAFT_STATE: [draft.slot]})
    return handoff_parts(rows, handoff_row_bytes(engine.cache, engine.proposer), PART_BYTES)


def arrived_checksum(engine: EngineCore, part: HandoffPart, capability: str) -> int:
    """Decode side: the checksum of one of ``arrived_parts``, once it has landed; the parts' sum is
    ``sent_checksum``'s."""
    return rows_checksum(pool_storages(engine.cache, engine.proposer), part.rows, capability, part.start_word)


def first_token(request: Request) -> SampledToken:
    """The token a prefill produced, with its logprobs, to start the decode engine from."""
    return SampledToken(
        token_id=request.output_ids[0],
        logprob=request.logprobs[0] if request.logprobs else None,
        top_logprobs=list(request.top_logprobs[0]) if request.top_logprobs else None,
    )
