"""Continuous batching with chunked prefill, preemption by recompute, and stop handling.

Each ``schedule()`` fills one step's token budget: running requests first (a decode is one token,
an unfinished prefill its next chunk), then waiting requests in arrival order. A request that cannot
get blocks preempts the most recently admitted running request, which frees everything and waits to
recompute its tokens; nothing is lost. ``update()`` applies the sampled tokens and finishes requests.

Speculative decoding: ``schedule(drafts)`` turns a drafted request's chunk into a verify chunk, its
uncomputed tokens (the "tail") followed by its drafts::

    all_ids:  | computed (past) | tail |                       (tail: up to k + 1 tokens)
    chunk:                      | tail | draft 0 .. draft k-1 |  logits of its last 1 + k rows

With ``--kda-rollback states`` the KDA layers kept the state after every draft (``spec_slots``):
    a accepted:       num_computed = past + len(tail) + a  (the slot takes the state after draft a - 1;
                                                           the new token alone is the next tail, so
                                                           every verify chunk is 1 + k tokens)
With ``replay`` (batch-invariant mode's):
    all k accepted:   num_computed = past + len(chunk)    (the slot holds the state after the drafts)
    fewer accepted:   num_computed = past + len(tail)     (the slot is restored from the checkpoint the
                                                           KDA layers took after the tail; the accepted
                                                           drafts and the new token: the next tail)

``update()`` appends the verified tokens one by one (a stop ends the request at that token), rolls
back or advances, and tells the proposer how many drafts were accepted.
"""

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from common.errors import NoCapacity

from .cache_manager import CacheManager
from .request import FinishReason, Request, RequestStatus
from .speculative.acceptance import Verified
from .speculative.proposal import DraftProposer, DraftTokens


@dataclass(frozen=True)
class ScheduledChunk:
    """Tokens of one request to run this step, and where its cache lives."""

    request_id: str
    token_ids: tuple[int, ...]
    past: int
    block_table: tuple[int, ...]
    slot: int
    samples: bool  # the chunk ends at the request's last known token: sample the next one
    num_draft: int = 0  # a verify chunk: its last ``num_draft`` tokens are ``SchedulerOutput.drafts``


@dataclass(frozen=True)
class SchedulerOutput:
    """One step's work: the chunks, in batch order, the requests preempted to make room, and the
    drafts of the verify chunks (cut to what fits), by request id."""

    chunks: tuple[ScheduledChunk, ...]
    preempted: tuple[str, ...]
    drafts: Mapping[str, DraftTokens] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(len(chunk.token_ids) for chunk in self.chunks)


@dataclass(frozen=True)
class SampledToken:
    """The model's choice for one request after a step."""

    token_id: int
    logprob: float | None
    top_logprobs: list[tuple[int, float]] | None


class Scheduler:
    """Owns the waiting queue and the running set (and, for handoffs, reserved and held requests).

    Args:
        cache: per-request block and slot accounting.
        max_num_seqs: running requests at most.
        max_num_batched_tokens: tokens per step at most.
        max_model_len: prompt + generated tokens a request may reach.
        proposer: speculative decoding's proposer (told what was accepted, and when a request stops
            holding its cache); None without speculation.
    """

    def __init__(
        self,
        cache: CacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        proposer: DraftProposer | None = None,
    ):
        self.cache = cache
        self.proposer = proposer
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.reserved: dict[str, Request] = {}  # decode side: waiting for their prompt's state
        self.held: dict[str, Request] = {}  # prefill side: finished, cache kept for the handoff
        self.requests: dict[str, Request] = {}
        # Queue times of requests first scheduled since take_queue_times(); bounded for an engine whose
        # owner never reads them (the offline LLM).
        self._queue_times: deque[float] = deque(maxlen=4096)

    def add(self, request: Request) -> None:
        """Queue a request.

        Raises:
            ValueError: duplicate id, empty prompt, or a request that can never fit the cache.
        """
        self._validate(request)
        self.requests[request.request_id] = request
        self.waiting.append(request)
        self.cache.prefetch(request)

    def reserve(self, request: Request) -> None:
        """Decode side of a handoff: hold blocks for the prompt and a slot, for a prefill worker to fill.
        The prompt's leading blocks this engine already holds (its device pool, then its host tier:
        ``CacheManager.find_held_prefix``) are kept, not reserved: ``request.num_cached_tokens`` says
        how many tokens they cover, and the handoff writes only the blocks after them.

        Raises:
            ValueError: as ``add``.
            NoCapacity: no seat, blocks or slot free right now (the router may try elsewhere).
        """
        self._validate(request)
        hit = self.cache.find_held_prefix(request)
        new_tokens = request.num_tokens - hit.num_blocks * self.cache.block_tokens
        seats = len(self.running) + len(self.reserved)
        if seats >= self.max_num_seqs or not self.cache.can_admit(request, hit, new_tokens):
            raise NoCapacity(f"no room to reserve {request.num_tokens} tokens and a state slot")
        self.cache.admit(request, hit, new_tokens)
        missing = request.num_tokens - request.num_computed  # more than new_tokens if the tier load failed
        if not self.cache.can_grow(request, missing):
            self.cache.release(request)
            raise NoCapacity(f"no room to reserve {request.num_tokens} tokens and a state slot")
        self.cache.grow(request, missing)
        request.status = RequestStatus.RESERVED
        self.requests[request.request_id] = request
        self.reserved[request.request_id] = request

    def complete_reserved(self, request_id: str, first: SampledToken) -> Request:
        """The prompt's state has arrived: the request decodes from ``first``, the prefill's token.

        Raises:
            KeyError: no such reserved request (aborted meanwhile, or never reserved).
        """
        request = self.reserved.pop(request_id)
        request.num_computed = request.num_tokens
        self.cache.record_progress(request)
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        self._append_sample(request, first)
        return request

    def expire_reserved(self, max_age_s: float, now: float) -> list[str]:
        """Abort reservations older than ``max_age_s`` whose state never arrived (their router went
        away between reserving and decoding); returns their ids."""
        stale = [rid for rid, r in self.reserved.items() if now - r.arrival_time > max_age_s]
        for request_id in stale:
            self.abort(request_id)
        return stale

    def release_held(self, request_id: str) -> None:
        """Prefill side: the handoff is done (or abandoned); free the kept cache."""
        request = self.held.pop(request_id)
        self._release(request)
        request.status = RequestStatus.FINISHED

    def take_queue_times(self) -> list[float]:
        """Queue times (arrival to first step, seconds) of the requests started since the last call."""
        taken = list(self._queue_times)
        self._queue_times.clear()
        return taken

    def _validate(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id: {request.request_id!r} is already in flight")
        if not request.prompt_ids:
            raise ValueError("prompt: must contain at least one token")
        longest = min(request.num_tokens + request.params.max_tokens - 1, self.max_model_len)
        if request.num_tokens >= self.max_model_len:
            raise ValueError(
                f"prompt: {request.num_tokens} tokens leave no room under max_model_len "
                f"({self.max_model_len})"
            )
        if longest > self.cache.total_tokens():
            raise ValueError(
                f"prompt + max_tokens: {longest} tokens exceed the whole cache "
                f"({self.cache.total_tokens()} tokens); shorten the request or grow the cache"
            )

    def abort(self, request_id: str) -> Request | None:
        """Cancel a request wherever it is; its cache is freed at once. Unknown ids are ignored."""
        request = self.requests.get(request_id)
        if request is None:
            return None
        self._finish(request, FinishReason.ABORT)
        return request

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.reserved or self.held)

    def draftable(self) -> list[Request]:
        """The running requests a proposer drafts for this step: every prompt token computed, at least
        one token generated, not prefill-only (``hold_cache``), no logit bias, penalties or grammar
        (they depend on the tokens before each position: such requests decode a token a step,
        ``sampling/penalties.py``, ``sampling/grammar.py``), and room for one draft under
        ``max_tokens`` and ``max_model_len``."""
        return [
            request
            for request in self.running
            if request.output_ids
            and not request.params.processes_logits
            and not request.params.constrained
            and request.num_computed >= len(request.prompt_ids)
            and not request.hold_cache
            and self._draft_room(request) > 0
        ]

    def schedule(self, drafts: Mapping[str, DraftTokens] | None = None) -> SchedulerOutput:
        """Fill one step. ``drafts``: the proposer's tokens for ``draftable()`` requests; each becomes
        a verify chunk (drafts cut to what ``max_tokens``, ``max_model_len`` and the budget leave; a
        request whose drafts do not fit, or do not get blocks, runs a plain chunk). The proposer
        forgets the requests whose drafts were not scheduled."""
        drafts = drafts or {}
        budget = self.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted: list[str] = []
        verifying: dict[str, DraftTokens] = {}
        for request in list(self.running):
            if budget == 0:
                break
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            proposal = self._fit_drafts(request, drafts.get(request.request_id), budget)
            count = self._running_chunk_size(request, proposal, budget)
            while not self.cache.can_grow(request, count):
                if proposal is not None:  # drop the drafts before preempting anyone
                    proposal = None
                    count = self._running_chunk_size(request, proposal, budget)
                    continue
                victim = self.running[-1]
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is request:
                    break
            if request.status is not RequestStatus.RUNNING:
                continue
            self.cache.grow(request, count)
            chunks.append(self._chunk(request, count, proposal))
            if proposal is not None:
                verifying[request.request_id] = proposal
            budget -= count
        while self.waiting and not preempted and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if not self.cache.ready(request):  # its prefetch from the L3 is not over (the policy waits)
                break
            hit = self.cache.find_prefix(request)
            start = hit.num_blocks * self.cache.block_tokens
            count = self._chunk_size(request, start, budget, self.cache.branch_point(hit))
            if not self.cache.can_admit(request, hit, count):
                break
            self.waiting.popleft()
            if request.queue_seconds is None:  # not after a preemption: that wait is not queueing
                request.queue_seconds = time.monotonic() - request.arrival_time
                self._queue_times.append(request.queue_seconds)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            self.cache.admit(request, hit, count)
            if request.num_computed != start:  # the host tier's part failed to load: recompute it
                recount = self._chunk_size(request, request.num_computed, budget)
                if self.cache.can_grow(request, recount):
                    self.cache.grow(request, recount)
                    count = recount
            chunks.append(self._chunk(request, count))
            budget -= count
        for request_id in drafts.keys() - verifying.keys():
            if request_id in self.requests:  # its drafts were not verified: the proposer keeps its state
                self.proposer.discard(self.requests[request_id])
        return SchedulerOutput(tuple(chunks), tuple(preempted), verifying)

    def _draft_room(self, request: Request) -> int:
        """Drafts a verify step of ``request`` may carry: it emits up to ``k + 1`` tokens, which must not
        pass ``max_tokens`` or ``max_model_len``."""
        emitted = request.params.max_tokens - len(request.output_ids)
        return min(emitted, self.max_model_len - request.num_tokens) - 1

    def _fit_drafts(self, request: Request, proposal: DraftTokens | None, budget: int) -> DraftTokens | None:
        """``proposal`` cut to the request's draft room and what the budget leaves after its tail (its
        distributions' rows too); None when no draft fits."""
        if proposal is None:
            return None
        room = min(len(proposal.token_ids), self._draft_room(request), budget - request.num_pending)
        if room <= 0:
            return None
        if room == len(proposal.token_ids):
            return proposal
        probs = None if proposal.probs is None else proposal.probs[:room]
        return DraftTokens(proposal.token_ids[:room], probs)

    def _running_chunk_size(self, request: Request, proposal: DraftTokens | None, budget: int) -> int:
        """Tokens of a running request's chunk: with drafts the whole tail and the drafts (a verify
        chunk is never cut: its state is committed only at its checkpoint or its end), else the plain
        chunk size."""
        if proposal is None:
            return self._chunk_size(request, request.num_computed, budget)
        return request.num_pending + len(proposal.token_ids)

    def update(
        self, output: SchedulerOutput, sampled: Mapping[str, SampledToken | Verified]
    ) -> list[Request]:
        """Advance the scheduled requests past their chunks and apply sampled tokens (a ``Verified``
        for each verify chunk).

        Returns:
            The requests that finished in this step.
        """
        finished = []
        for chunk in output.chunks:
            request = self.requests.get(chunk.request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue  # aborted while the step ran
            if chunk.num_draft:
                if self._apply_verified(request, chunk, sampled[chunk.request_id]):
                    finished.append(request)
                continue
            request.num_computed = chunk.past + len(chunk.token_ids)
            self.cache.record_progress(request)
            if chunk.samples and self._append_sample(request, sampled[chunk.request_id]):
                finished.append(request)
        return finished

    def _apply_verified(self, request: Request, chunk: ScheduledChunk, verified: Verified) -> bool:
        """Append a verify step's tokens up to the first that stops the request, commit the chunk's
        tokens whose state is right (all of it when every draft was accepted and kept, else its tail,
        restoring the slot from the checkpoint), then finish the request or tell the proposer. Returns
        whether the request finished."""
        reason, before = None, len(request.output_ids)
        for index, token in enumerate(verified.token_ids):
            logprob = None if verified.logprobs is None else verified.logprobs[index]
            top = None if verified.top_logprobs is None else verified.top_logprobs[index]
            self._record_token(request, SampledToken(token, logprob, top))
            reason = self._stop_reason(request, token)
            if reason is not None:
                break
        kept = len(request.output_ids) - before  # a stop may drop the last accepted drafts
        request.num_draft_tokens += chunk.num_draft
        request.num_accepted_draft_tokens += min(verified.num_accepted, kept)
        if self.cache.rollback_mode == "states":  # the state after each draft was kept: take the last
            accepted = min(verified.num_accepted, kept)
            self.cache.commit_drafts(request, accepted)
            request.num_computed = chunk.past + len(chunk.token_ids) - chunk.num_draft + accepted
        elif verified.num_accepted == chunk.num_draft and kept >= chunk.num_draft:
            request.num_computed = chunk.past + len(chunk.token_ids)
        else:
            self.cache.rollback(request)
            request.num_computed = chunk.past + len(chunk.token_ids) - chunk.num_draft
        self.cache.record_progress(request)
        if reason is not None:
            self._finish(request, reason)
            return True
        self.proposer.commit(request, verified.num_accepted)
        return False

    def _append_sample(self, request: Request, token: SampledToken) -> bool:
        """Record a sampled token; finish the request if it stops here. Returns whether it did."""
        self._record_token(request, token)
        reason = self._stop_reason(request, token.token_id)
        if reason is not None:
            self._finish(request, reason)
        return reason is not None

    def _record_token(self, request: Request, token: SampledToken) -> None:
        request.output_ids.append(token.token_id)
        if token.logprob is not None:
            request.logprobs.append(token.logprob)
        if token.top_logprobs is not None:
            request.top_logprobs.append(token.top_logprobs)

    def _stop_reason(self, request: Request, token: int) -> FinishReason | None:
        params = request.params
        if token in params.stop_token_ids or (token in request.stop_ids and not params.ignore_eos):
            return FinishReason.STOP
        if request.grammar is not None:  # advanced by the sampled token; complete: nothing may follow
            request.grammar.sync(request.generated_ids)
            if request.grammar.done:
                return FinishReason.STOP
        if len(request.output_ids) >= params.max_tokens or request.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

    def _chunk_size(self, request: Request, start: int, budget: int, branch_tokens: int | None = None) -> int:
        """Tokens to run from ``start``: the budget's share, cut once when a multi-token chunk crosses a
        snapshot point (``cache/snapshot_policy.py`` ``cut_point``: the branch point, else the chunk's last
        stride or prompt-end point; ``branch_tokens``: the branch point of a request being admitted, else
        its own), so the prefix cache can keep the KDA state there. (A prompt whose end is not on a
        boundary thus runs its short tail in one more step.)"""
        count = min(request.num_tokens - start, budget)
        if count > 1 and self.cache.prefix_caching and self.cache.has_state:
            branch = request.branch_tokens if branch_tokens is None else branch_tokens
            point = self.cache.policy.cut_point(request, start, start + count, branch)
            if point is not None:
                count = point - start
        return count

    def _chunk(self, request: Request, count: int, drafts: DraftTokens | None = None) -> ScheduledChunk:
        """The request's next ``count`` tokens from ``num_computed``: known tokens, then ``drafts``."""
        start = request.num_computed
        num_draft = len(drafts.token_ids) if drafts is not None else 0
        known = tuple(request.all_ids[start : start + count - num_draft])
        return ScheduledChunk(
            request_id=request.request_id,
            token_ids=known + (drafts.token_ids if drafts is not None else ()),
            past=start,
            block_table=tuple(request.block_table),
            slot=request.slot,
            samples=start + len(known) == request.num_tokens,
            num_draft=num_draft,
        )

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self._forget_drafts(request)
        self.cache.release(request)
        request.status = RequestStatus.WAITING
        self.waiting.appendleft(request)

    def _release(self, request: Request, record_end: bool = True) -> None:
        """The request stops holding its cache for good: snapshot its end (with ``record_end``), free
        it, tell the proposer."""
        self._forget_drafts(request)
        if record_end:
            self.cache.record_end(request)
        self.cache.release(request)

    def _forget_drafts(self, request: Request) -> None:
        if self.proposer is not None:
            self.proposer.release(request.request_id)

    def check_integrity(self) -> None:
        """Every request holding a cache (running, reserved, held) holds its own state slot and, when
        speculating, its ``spec_slots``; no slot is held twice and no other slot is in use."""
        holders = [*self.running, *self.reserved.values(), *self.held.values()]
        slots = [r.slot for r in holders] + [slot for r in holders for slot in r.spec_slots]
        assert None not in slots, "a request holding a cache has no state slot"
        assert len(set(slots)) == len(slots), "a state slot is held twice"
        assert len(slots) == self.cache.slots_per_request * len(holders), "a request lacks a speculation slot"
        assert set(slots) == self.cache.slots.used, "state slots in use that no request holds"

    def _finish(self, request: Request, reason: FinishReason) -> None:
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.reserved.pop(request.request_id, None)
        request.finish_reason = reason
        self.requests.pop(request.request_id, None)
        if request.hold_cache and reason is not FinishReason.ABORT:
            request.status = RequestStatus.HELD
            self.held[request.request_id] = request
            return
        self.held.pop(request.request_id, None)
        # A reservation's slot holds whatever a handoff wrote (all of the prompt, or a refused one's
        # bytes), not the state after its num_computed (its own prefix hit): never snapshot it.
        self._release(request, record_end=request.status is not RequestStatus.RESERVED)
        request.status = RequestStatus.FINISHED
