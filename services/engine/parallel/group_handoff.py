"""``GroupHandoff``: rank 0's side of a handoff into or out of an engine whose ranks each have their own
transfer agent (``rank_handoff.py`` is every rank's side).

At start (``open``) every rank registers its pools (a sending engine: and a staging buffer) with its own
agent and rank 0 collects the endpoints, in rank order: a decode worker's reservation answer carries
them. A prefill worker checks a reservation against its own ranks before computing (``check_sender``:
``handoff_plan.check_mappable``; a decode worker runs it at Reserve on the router's chosen sender),
and after the held prefill (``send``) has every rank plan and write its part, waits for every rank's
report and only then notifies decode rank 0::

    rank 0: HandoffCommand ──► every rank: plan its part, gather into staging, write_bytes
            every RankSent ◄── (an error is reported, not raised: the group stays in step)
            all written: an empty write carrying the request id to decode rank 0's agent

The whole handoff runs on the engine loop thread, between steps: the followers take the command where
they take steps, so the engine steps no request while a handoff is being written.
"""

import time

import torch

from common.errors import TransferError
from kernels.kda.fixed_chunk import CHUNK as FIXED_CHUNK
from services.engine.cache_manager import CacheManager
from services.engine.handoff import (
    HandoffLayout,
    HeldPrefill,
    Reservation,
    check_layout,
    handoff_tag,
    row_for_row,
)
from services.engine.handoff_checksum import checksum_key
from services.engine.model.config import ModelConfig
from services.transfer import TransferBackend, TransferEndpoint

from .handoff_plan import HandoffRequestRows, HandoffSide, check_mappable
from .rank_group import RankGroup
from .rank_handoff import (
    HandoffCommand,
    LandedCheck,
    RankSent,
    RankTransfer,
    TransferSetup,
    landed_checksum,
    staging_bytes_for,
)


def handoff_side(layout: HandoffLayout) -> HandoffSide:
    """The plan's view of a group's pools, from its ``HandoffLayout``."""
    open_rows = FIXED_CHUNK if layout.numerics == "batch_invariant" else 0
    return HandoffSide(
        layout.parallel, layout.block_size, getattr(torch, layout.dtype), layout.kv_format, open_rows
    )


def check_sender(model: ModelConfig, prefill: HandoffLayout, decode: HandoffLayout | None) -> None:
    """Refuse a prefill layout that cannot write into a decode layout: every field equal between two
    single-rank engines (``check_layout``), else the model and its bytes' meaning equal and the ranks
    mappable (``check_mappable``). A prefill worker checks a reservation with it before computing, a
    decode worker the router's chosen sender at Reserve, before holding room.

    Raises:
        ValueError: naming the field, as ``check_layout`` (which also refuses no decode layout) and
            ``check_mappable`` do.
    """
    check_layout(decode, prefill)
    if not row_for_row(decode, prefill):
        check_mappable(model, handoff_side(prefill), handoff_side(decode))


def not_a_target(model: ModelConfig, layout: HandoffLayout) -> str | None:
    """Why no prefill group can write into an engine of ``layout`` (``check_mappable``'s refusals that
    depend on the decode side alone, e.g. ``decode --pcp 2``), or None: a decode worker says so at
    Reserve, before a prefill worker is involved."""
    side = handoff_side(layout)
    try:
        check_mappable(model, side, side)
    except ValueError as error:
        return str(error)
    return None


class GroupHandoff:
    """Every rank's transfer agent, opened from rank 0 (call ``open`` and ``send`` on the engine loop
    thread: they use the control group, as steps do).

    Attributes:
        endpoints: every rank's ``TransferEndpoint``, in rank order (rank 0's is ``backend``'s); empty
            on a single-rank engine.
    """

    def __init__(
        self,
        model: ModelConfig,
        layout: HandoffLayout,
        ranks: RankGroup | None,
        transfer: RankTransfer,
        endpoints: tuple[TransferEndpoint, ...],
    ):
        self._model, self.layout, self._ranks = model, layout, ranks
        self._transfer = transfer
        self.endpoints = endpoints

    @classmethod
    def open(
        cls,
        model: ModelConfig,
        layout: HandoffLayout,
        ranks: RankGroup | None,
        cache: CacheManager,
        backend: TransferBackend,
        max_model_len: int,
        sends: bool,
    ) -> "GroupHandoff":
        """Register every rank's pools (and, when the engine ``sends``, a staging buffer of one longest
        request) with its own agent: rank 0's is ``backend``, a follower's is named after it.

        Raises:
            TransferError: a rank could not open its agent (naming the rank).
        """
        staging = staging_bytes_for(cache, max_model_len) if sends else 0
        transfer = RankTransfer(backend, model, cache.blocks.storage, cache.slots.storage, staging)
        setup = TransferSetup(backend.name, backend.agent_name, staging)
        # One rank: no follower to open, and its own endpoint is the worker's (``endpoints`` stays empty).
        answers = [] if ranks is None else ranks.ask(setup, lambda: _endpoint_or_error(backend))
        errors = [answer for answer in answers if isinstance(answer, str)]
        if errors:
            raise TransferError("opening the ranks' transfer agents failed: " + "; ".join(errors))
        return cls(model, layout, ranks, transfer, tuple(answers))

    def send(
        self,
        held: HeldPrefill,
        num_tokens: int,
        reservation: Reservation,
        endpoints: tuple[TransferEndpoint, ...],
        timeout_s: float,
        checksum: bool = False,
    ) -> tuple[RankSent, ...]:
        """Write a held prefill's ``num_tokens`` cached tokens (those after the reservation's
        ``cached_tokens``, which decode holds) and KDA slot into ``reservation``, every rank its part,
        then notify decode rank 0 (``endpoints[0]``) with the request id. With ``checksum`` every rank
        also hashes what it writes under the capability's key (its ``RankSent.checksum``; the handoff's
        checksum is their sum, ``sent_checksum``).

        Returns:
            every rank's report, in rank order.

        Raises:
            ValueError: the decode group cannot be mapped, or the endpoints are not one per decode rank.
            TransferError: a rank's write failed (naming the ranks and their errors), or the notification.
        """
        decode = reservation.layout
        if len(endpoints) != decode.parallel.world_size:
            raise ValueError(
                f"rank_endpoints: {len(endpoints)} endpoints for a decode group of "
                f"{decode.parallel.world_size} ranks (one per rank, in rank order)"
            )
        prefill_side, decode_side = handoff_side(self.layout), handoff_side(decode)
        check_mappable(self._model, prefill_side, decode_side)  # before any rank is involved
        rows = HandoffRequestRows(
            num_tokens,
            held.block_ids,
            held.slot,
            reservation.block_ids,
            reservation.slot,
            reservation.cached_tokens,
        )
        key = checksum_key(reservation.capability) if checksum else None
        command = HandoffCommand(held.request_id, prefill_side, decode_side, rows, endpoints, timeout_s, key)
        start = time.monotonic()
        own = lambda: self._transfer.send(0, command)  # noqa: E731
        reports = tuple(self._ranks.ask(command, own) if self._ranks is not None else [own()])
        failed = [f"rank {report.rank}: {report.error}" for report in reports if report.error]
        if failed:
            raise TransferError(f"request {held.request_id!r}: handoff writes failed: " + "; ".join(failed))
        backend = self._transfer.backend
        peer = backend.connect(endpoints[0])
        remaining = max(1.0, timeout_s - (time.monotonic() - start))
        backend.write(
            peer, {}, message=handoff_tag(held.request_id, reservation.capability), timeout_s=remaining
        )
        return reports

    def landed(self, check: LandedCheck) -> int:
        """Decode side: a parallel handoff's checksum over what landed in every rank's pools (each
        rank's ``landed_checksum``, summed).

        Raises:
            TransferError: a rank could not hash its share (naming it).
        """
        own = lambda: _landed_or_error(self._model, self._transfer.storages, check)  # noqa: E731
        answers = self._ranks.ask(check, own) if self._ranks is not None else [own()]
        errors = [answer for answer in answers if isinstance(answer, str)]
        if errors:
            raise TransferError("hashing the handoff's landed bytes failed: " + "; ".join(errors))
        return sum(answers) % (1 << 64)


def sent_checksum(reports: tuple[RankSent, ...]) -> int:
    """A parallel handoff's checksum: the sum of its ranks' (``GroupHandoff.send(checksum=True)``)."""
    return sum(report.checksum for report in reports) % (1 << 64)


def _landed_or_error(model: ModelConfig, storages: dict, check: LandedCheck) -> int | str:
    """Rank 0's answer to its own ``LandedCheck``: raising here would leave the group out of step."""
    try:
        return landed_checksum(model, storages, check, 0)
    except Exception as error:  # noqa: BLE001 (answered, as the followers do)
        return f"rank 0: {type(error).__name__}: {error}"


def _endpoint_or_error(backend: TransferBackend) -> TransferEndpoint | str:
    """Rank 0's answer to its own ``TransferSetup``: raising here would leave the followers waiting."""
    try:
        return backend.endpoint()
    except TransferError as error:
        return f"rank 0: {error}"
