"""``EngineService``: the one face a worker's servers see of its engine.

The gRPC servicers and the worker server never touch the scheduler or the cache: they call these
methods from their handler threads, each call runs on the engine loop's thread between steps
(``EngineLoop.call``), and what comes back is a frozen snapshot (``Reservation``, ``HeldPrefill``,
``PoolState``, ``WorkerLoad``) or a stream of ``RequestDelta``s, never a live engine object::

    gRPC threads ── reserve / generate / prefill / accept_handoff / ... ──► [engine loop thread]
                 ◄── snapshots, delta streams ───────────────────────────── steps, then observers

Two kinds of method: the ones that wait for the loop (a running step may take a while) and the
ones that only queue work and return a ``Future`` (``abort``, ``free_reservation``), which are the
only ones a gRPC cancellation callback may call. After every pass (a step or a command) the loop
frees reservations older than the TTL, takes the load once, and hands both to the observers.
"""

import queue
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from common.sampling_params import MAX_LOGPROBS, SamplingParams
from services.transfer import TransferBackend, TransferEndpoint

from .adapters.lora_adapter import LoraAdapter
from .draft_handoff import register_draft_pools, reserved_draft
from .engine_core import EngineCore
from .engine_loop import EngineLoop, RequestDelta
from .engine_views import EngineInfo, EnginePass, PoolState, info_of, load_of, pool_state_of, spec_counts_of
from .handoff import (
    HandoffLayout,
    HandoffPart,
    HeldPrefill,
    Reservation,
    arrived_checksum,
    arrived_parts,
    check_decode_hit,
    handoff_row_bytes,
    held_prefill_for,
    layout_of,
    pool_storages,
    register_pools,
    reservation_of,
    row_for_row,
    sent_checksum,
)
from .handoff_checksum import checksum_key
from .parallel.group_handoff import GroupHandoff, check_sender, handoff_side, not_a_target
from .parallel.rank_handoff import LandedCheck, RankSent, landed_checksum
from .scheduler import SampledToken
from .scoring import ScoredToken, ScoreItem, score_ranked

DeltaStream = queue.Queue  # of RequestDelta: a request's new tokens, the last one with its finish reason


@dataclass(frozen=True)
class ReserveResult:
    """A decode engine's answer to a reservation: room held (``reservation``), or none because the
    prompt is cheaper to prefill here (``reservation`` None; ``cached_tokens`` of it are cached)."""

    reservation: Reservation | None
    cached_tokens: int

    @property
    def prefill_locally(self) -> bool:
        return self.reservation is None


class EngineService:
    """One engine on its own loop thread, behind snapshot-returning calls.

    Args:
        engine: the engine; from now on only the loop thread touches it.
        reservation_ttl_s: decode: reservations older than this are freed (their state never came);
            None frees none.

    ``layout`` (the handoff layout) and ``info`` are fixed at start; ``cached_at_start`` is the block
    hashes the prefix cache held when its events started (each ``EnginePass`` carries the events
    since). ``loop`` is for tests that drive the engine directly; servers use the methods.
    """

    def __init__(self, engine: EngineCore, reservation_ttl_s: float | None = None):
        self.layout = layout_of(engine)
        self._model_config = engine.model.config  # for the handoff checks (immutable)
        self.info: EngineInfo = info_of(engine)
        self._cache = engine.cache  # for register_pools only: the pools' storages never move
        self._proposer = engine.proposer  # for register_pools only: its draft's pools, if any
        # What a row-for-row handoff's parts are split by (send_state); the pools never change shape.
        self.handoff_row_bytes = handoff_row_bytes(engine.cache, engine.proposer)
        self.world_size = engine.config.world_size
        self._group: GroupHandoff | None = None  # every rank's transfer agent (register_pools)
        self.rank_endpoints: tuple[TransferEndpoint, ...] = ()  # a parallel engine's, in rank order
        # Why no prefill group can write into this engine (decode --pcp / --pp), whatever the sender.
        self._not_a_target = not_a_target(engine.model.config, self.layout)
        self.cached_at_start = frozenset(engine.cache.blocks.record_events())
        self._reservation_ttl_s = reservation_ttl_s
        self._observers: list[Callable[[EnginePass], None]] = []
        self.loop = EngineLoop(engine, after_step=self._after_pass)

    def observe(self, observer: Callable[[EnginePass], None]) -> None:
        """Call ``observer`` on the loop thread after every pass from now on (it must not block), and
        once at once."""
        self._observers.append(observer)
        self.refresh()

    def refresh(self) -> None:
        """Run one pass now (observers see the current load, e.g. a draining flag set meanwhile)."""
        self.loop.call(lambda engine: None)

    def register_pools(self, backend: TransferBackend, sends: bool = False) -> None:
        """Register the block and slot pools with a transfer backend (at start). A parallel engine's
        followers each open their own agent over their pools (``rank_endpoints``: every rank's, in rank
        order); an engine that ``sends`` handoffs (a prefill worker) also registers a staging buffer on
        every rank, so it can write into a decode group of another layout. A draft model's pools
        (single-rank engines only) are registered beside the target's.

        Raises:
            TransferError: a rank could not open its agent.
        """
        if self.world_size == 1 and not sends:
            register_pools(backend, self._cache, self._proposer)
            return
        if self.world_size == 1:
            register_draft_pools(backend, self._proposer)

        def open_group(engine: EngineCore) -> GroupHandoff:
            return GroupHandoff.open(
                engine.model.config,
                self.layout,
                engine.ranks,
                engine.cache,
                backend,
                engine.config.max_model_len,
                sends,
            )

        self._group = self.loop.call(open_group)
        if self.world_size > 1:
            self.rank_endpoints = self._group.endpoints

    # ---- decode side ------------------------------------------------------------------------------

    def reserve(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str,
        tenant: str = "",
        resumed_tokens: int = 0,
        local_prefill_max_tokens: int | None = None,
        adapter: str = "",
        prefill_layout: HandoffLayout | None = None,
    ) -> ReserveResult:
        """Hold room for a prompt's handoff, or decline when ``local_prefill_max_tokens`` is given and
        the prompt is cheaper to prefill here (``prefill_here``). One loop call: the prefix lookup and
        the reservation see the same cache. The reservation's layout carries this engine's parallel
        degrees: a parallel engine's ranks each receive their share (``rank_endpoints``). An engine no
        prefill group can write into (``--pcp`` or ``--pp`` above 1: ``check_mappable``) declines.
        ``prefill_layout``: the sender the router chose; one that cannot write here is refused before
        any room is held (``check_sender``, as the prefill worker checks at Prefill).

        Raises:
            ValueError: a bad request (naming the field), a ``prefill_layout`` that cannot write here
                (``prefill_layout``: and the field that differs), or a reservation that such an engine
                must take (``local_prefill_max_tokens`` None), naming the flag.
            NoCapacity: nothing free right now.
        """
        if prefill_layout is not None and self._not_a_target is None:
            try:
                check_sender(self._model_config, prefill_layout, self.layout)
            except ValueError as error:
                raise ValueError(f"prefill_layout: cannot write into this decode worker: {error}") from None

        def reserve_or_decline(engine: EngineCore) -> ReserveResult:
            if self._not_a_target is not None:  # no prefill group can write here: prefill here instead
                if local_prefill_max_tokens is None:
                    raise ValueError(self._not_a_target)
                return ReserveResult(None, engine.cached_prefix_tokens(prompt_ids, tenant, adapter))
            if local_prefill_max_tokens is not None:
                cached = engine.cached_prefix_tokens(prompt_ids, tenant, adapter)
                block_size = engine.cache.block_tokens  # a DCP group's virtual block
                if prefill_here(len(prompt_ids), cached, local_prefill_max_tokens, block_size):
                    return ReserveResult(None, cached)
            reserved = engine.reserve(
                prompt_ids, params, request_id, tenant, resumed_tokens=resumed_tokens, adapter=adapter
            )
            draft = reserved_draft(engine.proposer, request_id)
            return ReserveResult(reservation_of(reserved, self.layout, draft), 0)

        return self.loop.call(reserve_or_decline)

    def accept_handoff(self, request_id: str, first: SampledToken, with_draft: bool = False) -> DeltaStream:
        """The reservation's state has arrived: decode it from ``first`` (the prefill's token);
        ``with_draft``: the draft's prompt rows came too (``EngineCore.complete_reserved``).

        Raises:
            KeyError: no such reservation (freed meanwhile).
            ValueError: ``with_draft`` on an engine without a draft model.
        """

        def start(engine: EngineCore) -> DeltaStream:
            reserved = engine.scheduler.reserved[request_id]
            stream = self.loop.watch(reserved)
            engine.complete_reserved(request_id, first, with_draft)
            return stream

        return self.loop.call(start)

    def arrived_parts(self, request_id: str, with_draft: bool) -> list[HandoffPart]:
        """The parts a handoff into the reserved ``request_id`` lands in (``handoff.arrived_parts``), on
        the loop thread.

        Raises:
            KeyError: no such reservation.
        """
        return self.loop.call(lambda engine: arrived_parts(engine, request_id, with_draft), read_only=True)

    def arrived_checksum(self, part: HandoffPart, capability: str) -> Future:
        """The checksum of a part that landed (``handoff.arrived_checksum``), queued for the loop thread at
        once (a ``Future`` of the int: the caller waits for the next part meanwhile)."""
        return self.loop.submit(lambda engine: arrived_checksum(engine, part, capability), read_only=True)

    def landed_checksum(self, request_id: str, capability: str) -> Future:
        """The checksum of what a parallel handoff filled in the reserved ``request_id``'s rows, on every
        rank (``handoff_checksum.spans_checksum`` by landing address; its prefill group's ranks hashed the
        same bytes as they wrote them), queued for the loop thread (a ``Future`` of the int)."""
        return self.loop.submit(
            lambda engine: self._landed_checksum(engine, request_id, capability), read_only=True
        )

    def _landed_checksum(self, engine: EngineCore, request_id: str, capability: str) -> int:
        request = engine.scheduler.reserved[request_id]
        check = LandedCheck(
            handoff_side(self.layout),
            len(request.prompt_ids),
            tuple(request.block_table),
            request.slot,
            request.num_cached_tokens,
            checksum_key(capability),
        )
        if self._group is not None:
            return self._group.landed(check)
        return landed_checksum(engine.model.config, pool_storages(engine.cache, None), check, 0)

    def free_reservation(self, request_id: str) -> "Future[bool]":
        """Queue freeing ``request_id`` if it is still a reservation (never a request that is
        decoding); does not wait. The ``Future`` says whether one was freed."""
        return self.loop.submit(lambda engine: _free_reservation(engine, request_id))

    # ---- either side ------------------------------------------------------------------------------

    def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str,
        tenant: str = "",
        resumed_tokens: int = 0,
        adapter: str = "",
    ) -> DeltaStream:
        """Prefill and decode a request here; its deltas (``adapter``: a loaded LoRA adapter or "").

        Raises:
            ValueError: a bad request (naming the field).
        """
        return self.loop.call(
            lambda engine: self.loop.watch(
                engine.add_request(
                    prompt_ids, params, request_id, tenant, adapter=adapter, resumed_tokens=resumed_tokens
                )
            )
        )

    def score_prompt(self, prompt_ids: list[int], top_n: int = 0, adapter: str = "") -> list[ScoredToken]:
        """The log-prob of every prompt token from the second on, each with its row's ``top_n`` most
        likely alternatives, from one prefill on private pools between steps (``scoring.score_ranked``:
        the serving pools, the prefix cache and the requests in flight are not touched). The first
        token has none (nothing before it), so a prompt of ``L`` tokens gives ``L - 1``.

        Raises:
            ValueError: an empty prompt, one over ``max_model_len``, a token outside the vocabulary,
                an adapter not loaded (naming the field), or a parallel engine (scoring runs on one rank).
        """
        if not prompt_ids:
            raise ValueError("prompt_ids: needs at least one token")
        if not 0 <= top_n <= MAX_LOGPROBS:
            raise ValueError(f"top_logprobs: must be between 0 and {MAX_LOGPROBS}, got {top_n}")

        def score(engine: EngineCore) -> list[ScoredToken]:
            item = _prompt_item(engine, prompt_ids, adapter)
            table = engine.adapters.table
            return score_ranked(engine.model, [item], table, engine.config.max_num_batched_tokens, top_n)[0]

        return self.loop.call(score, read_only=True)

    def abort(self, request_id: str) -> Future:
        """Queue aborting ``request_id`` (whatever it is: waiting, running, reserved); does not wait."""
        return self.loop.submit(lambda engine: engine.abort(request_id))

    def has_unfinished(self) -> bool:
        return self.loop.call(lambda engine: engine.has_unfinished)

    def integrity(self) -> PoolState:
        return self.loop.call(pool_state_of)

    # ---- prefill side -----------------------------------------------------------------------------

    def prefill(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        reservation: Reservation,
        tenant: str = "",
        resumed_tokens: int = 0,
        adapter: str = "",
        decode_endpoints: int = 1,
    ) -> DeltaStream:
        """Compute a prompt and its first token for ``reservation`` and keep its cache for the handoff
        (``held_prefill``, then ``send_rank_handoff`` or ``send_state``, then ``discard``). The
        reservation's layout is checked first: equal to this engine's for a row-for-row handoff, else
        mappable rank to rank (``check_sender``).

        ``decode_endpoints``: how many decode ranks' endpoints came with the reservation (one per rank).

        Raises:
            ValueError: the reservation's layout differs from this engine's or cannot be mapped onto its
                ranks (naming the field), endpoints that are not one per decode rank, or a bad request.
        """
        check_sender(self._model_config, self.layout, reservation.layout)
        check_decode_hit(reservation, len(prompt_ids))
        if not row_for_row(reservation.layout, self.layout) and self._group is None:
            raise ValueError(
                "reservation.layout.parallel: this engine has no per-rank transfer agents (its pools "
                "were registered for row-for-row handoffs only)"
            )
        decode_ranks = reservation.layout.parallel.world_size
        if decode_endpoints != decode_ranks:
            raise ValueError(
                f"rank_endpoints: {decode_endpoints} endpoints for a decode worker of {decode_ranks} ranks "
                "(pass the ReserveResponse's on unchanged)"
            )
        request_id = reservation.request_id
        return self.loop.call(
            lambda engine: self.loop.watch(
                engine.add_prefill_only(
                    prompt_ids, params, request_id, tenant, resumed_tokens=resumed_tokens, adapter=adapter
                )
            )
        )

    def send_rank_handoff(
        self,
        held: HeldPrefill,
        num_tokens: int,
        reservation: Reservation,
        endpoints: tuple[TransferEndpoint, ...],
        timeout_s: float = 30.0,
        checksum: bool = False,
    ) -> tuple[RankSent, ...]:
        """Write a held prefill into a reservation of another layout, every rank its share, between
        steps (``GroupHandoff.send``); decode rank 0 is notified once every rank's writes are done. With
        ``checksum`` each rank hashes what it writes (``group_handoff.sent_checksum`` sums them).

        Returns:
            every rank's ``RankSent``, in rank order.

        Raises:
            ValueError: endpoints that are not one per decode rank.
            TransferError: a rank's write failed (the group stays up; nothing is retried here).
        """
        return self.loop.call(
            lambda engine: self._group.send(held, num_tokens, reservation, endpoints, timeout_s, checksum)
        )

    def held_prefill(self, request_id: str, reservation: Reservation | None = None) -> HeldPrefill:
        """What ``send_state`` needs of a finished prefill for ``reservation``: with the draft's prompt
        rows when it asks for rows of this engine's draft (computed now, held until ``discard``).

        Raises:
            KeyError: nothing held for ``request_id`` (aborted, or discarded).
        """
        return self.loop.call(lambda engine: held_prefill_for(engine, request_id, reservation))

    def sent_checksum(self, held: HeldPrefill, reservation: Reservation) -> Future:
        """The checksum of the rows ``send_state`` writes for ``held`` (``handoff.sent_checksum``), queued
        for the loop thread at once (a ``Future`` of the int), so the caller can write meanwhile; wait for
        it before ``discard``."""
        return self.loop.submit(lambda engine: sent_checksum(engine, held, reservation), read_only=True)

    def discard(self, request_id: str) -> None:
        """Free whatever the engine still keeps for ``request_id``: a held prefill's cache, or the
        prefill itself if still queued or running. Waits for the loop."""
        self.loop.call(lambda engine: _discard(engine, request_id))

    # ---- LoRA adapters ----------------------------------------------------------------------------

    def load_adapter(self, name: str, path: str) -> list[LoraAdapter]:
        """Load a PEFT LoRA folder as ``name`` between steps; returns every adapter now loaded.

        Raises:
            AdapterError (a ValueError): a bad name or folder, or ``name`` already loaded.
        """
        return self.loop.call(lambda engine: (engine.load_adapter(name, path), _adapters(engine))[1])

    def unload_adapter(self, name: str) -> list[LoraAdapter]:
        """Unload ``name`` between steps; returns every adapter still loaded.

        Raises:
            UnknownAdapter: not loaded. AdapterInUse: a request uses it (refused, nothing changes).
        """
        return self.loop.call(lambda engine: (engine.unload_adapter(name), _adapters(engine))[1])

    def adapters(self) -> list[LoraAdapter]:
        """The adapters loaded now, sorted by name."""
        return self.loop.call(_adapters)

    def close(self) -> None:
        """Stop the loop, then the engine's follower ranks (if any)."""
        self.loop.close()
        self.loop.engine.close()

    def _after_pass(self, engine: EngineCore) -> None:
        expired: list[str] = []
        if self._reservation_ttl_s is not None:
            expired = engine.scheduler.expire_reserved(self._reservation_ttl_s, time.monotonic())
        report = EnginePass(
            load_of(engine),
            tuple(expired),
            tuple(engine.scheduler.take_queue_times()),
            tuple(engine.cache.blocks.take_events()),
            engine.cache.counts(),
            tuple(engine.cache.take_prefetch_outcomes()),
            spec_counts_of(engine),
        )
        for observer in self._observers:
            observer(report)


def prefill_here(prompt_tokens: int, cached_tokens: int, max_uncached: int, block_size: int) -> bool:
    """Conditional disaggregation: a short uncached remainder, or a full cache hit (every block but
    the last, partial one), is cheaper to prefill here than to hand off."""
    uncached = prompt_tokens - cached_tokens
    return uncached <= max_uncached or (cached_tokens > 0 and uncached <= block_size)


def _prompt_item(engine: EngineCore, prompt_ids: list[int], adapter: str) -> ScoreItem:
    """A prompt as the ``ScoreItem`` of its own tokens after the first; ValueError naming the field."""
    config = engine.config
    if config.world_size > 1:
        raise ValueError(f"prompt_ids: scoring runs on one rank, this engine has {config.world_size}")
    if len(prompt_ids) > config.max_model_len:
        raise ValueError(f"prompt_ids: {len(prompt_ids)} tokens exceed max_model_len {config.max_model_len}")
    vocab = engine.model.config.vocab_size
    bad = next((k for k, token in enumerate(prompt_ids) if not 0 <= token < vocab), None)
    if bad is not None:
        token = prompt_ids[bad]
        raise ValueError(f"prompt_ids: id {token} at position {bad} is outside the vocabulary [0, {vocab})")
    return ScoreItem(tuple(prompt_ids[:1]), tuple(prompt_ids[1:]), engine.adapters.slot(adapter))


def _adapters(engine: EngineCore) -> list[LoraAdapter]:
    return [engine.adapters.get(name) for name in engine.adapters.names]


def _free_reservation(engine: EngineCore, request_id: str) -> bool:
    if request_id not in engine.scheduler.reserved:
        return False
    engine.abort(request_id)
    return True


def _discard(engine: EngineCore, request_id: str) -> None:
    engine.abort(request_id)
    if request_id in engine.scheduler.held:
        engine.scheduler.release_held(request_id)


__all__ = ["DeltaStream", "EngineService", "ReserveResult", "RequestDelta", "prefill_here"]
