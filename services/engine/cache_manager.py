"""Per-request cache accounting over the pools, with prefix reuse for a hybrid model.

The scheduler sees memory only through check-then-commit pairs: ``find_prefix`` / ``can_admit`` /
``admit`` for a waiting request, ``can_grow`` / ``grow`` for a running one, ``release`` at the end.
After each step ``record_progress`` registers newly completed blocks in the prefix cache and takes
KDA state snapshots at every ``snapshot_stride``-th block boundary (and ``record_end`` at the end of
a request), so a later request can reuse MLA blocks *and* restore the KDA state where they end.

A parallel engine's rank 0 turns on ``record_state_copies``: each snapshot save and restore is then
kept as a ``StateCopy`` (physical slot indices) until ``take_state_copies``, so the followers, each
holding its own shard of the state, make the same copies (``services/engine/parallel/rank_step.py``).

With decode context parallelism (``dcp > 1``) the accounting is in *virtual* blocks: one block id
covers ``block_tokens = dcp * B`` positions of a context, of which each DCP rank stores its ``B`` in
its own pool's block of that id (``services/engine/parallel/dcp_shard.py``). Block tables, prefix
hashes and snapshot boundaries all count ``block_tokens``, so the prefix cache works unchanged: a hit
shares block ids, and every rank's block of that id holds its part of the same tokens. KDA state is not
split by DCP.

With a host tier (``host``, one rank only) the device hit is extended from the tier: ``find_prefix``
asks how deep the tier can restore the chain, ``admit`` leases those pages, copies them into fresh
blocks and the KDA snapshot into the request's slot (or, if a page went missing or failed its
checksum, falls back to the device hit). Every block and snapshot registered is written through to the
tier, and a cached block the pool is about to reuse is offloaded first if the tier lacks it.

With a Redis L3 below the tier, ``prefetch`` (when a request arrives) starts bringing its prefix from
the L3 into the tier, and ``ready`` (the scheduler, before admitting it) answers by the worker's
prefetch policy (``prefetch_gate.py``).

Speculative decoding (``rollback_mode``) gives every admitted request more state slots
(``Request.spec_slots``): with ``replay`` one checkpoint slot, where the KDA layers copy its state after a
verify step's tail, before the drafts (``rollback`` restores the slot from it when a draft is rejected);
with ``states`` one slot per draft, where they keep the state after that draft (``commit_drafts`` copies
the last accepted one's into the request's slot). Only committed tokens ever reach ``record_progress``
and ``record_end``, so registered blocks and snapshots never hold a rejected draft.

``admit`` counts where each admitted request's cached prefix came from (``counters``,
``cache_counters.py``) and, with a tier, the tier's hits and misses for the match it was admitted on:
once per admission, however many passes the request waited (each pass calls ``find_prefix``).
"""

import dataclasses
from dataclasses import dataclass

from common.internal_tls import InternalTls
from common.prefix_hash import extend_chain
from kernels.kda.fixed_chunk import CHUNK as FIXED_CHUNK
from services.engine.cache.block_pool import BlockPool
from services.engine.cache.layout import block_layout, slot_layout, stage_layout
from services.engine.cache.snapshot_policy import DECODE, TURN_END, SnapshotPolicy
from services.engine.cache.snapshot_store import SnapshotStore
from services.engine.cache.state_pool import StateSlotPool
from services.engine.model.causal_lm import CausalLM
from services.engine.parallel.pipeline import stage_position
from services.engine.parallel.rank_step import RESTORE, SAVE, StateCopy
from services.hicache.host_tier import KDA, KV, TierMatch

from .cache_counters import DEVICE, HOST, CacheCounters, CacheCounts
from .engine_config import EngineConfig
from .host_cache_connector import HostCacheConnector
from .prefetch_gate import BEST_EFFORT, PrefetchGate, PrefetchOutcome
from .request import Request


@dataclass(frozen=True)
class PrefixHit:
    """Cached blocks a waiting request can start from, and the snapshot that restores its KDA state.

    ``block_ids`` are device blocks shared from the pool. With ``from_host`` the host tier supplies the
    rest: ``host_blocks`` more blocks after them and the snapshot under ``snapshot_hash`` (else that
    snapshot is the device store's). ``kv_blocks``: how deep the prompt matched cached KV (device or
    tier), where it branches off a cached prefix (a snapshot is taken there). ``kv_only``: a hit on KV
    blocks alone, for a reservation whose KDA state a handoff brings (``find_held_prefix``).
    ``tier_match``: the tier's answer for the first ``tier_blocks`` blocks of the chain (None: the tier
    was not asked), counted in its hits and misses if the request is admitted from this hit."""

    block_ids: tuple[int, ...] = ()
    snapshot_hash: bytes | None = None
    host_blocks: int = 0
    from_host: bool = False
    kv_blocks: int = 0
    kv_only: bool = False
    tier_match: TierMatch | None = None
    tier_blocks: int = 0

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids) + self.host_blocks


def spec_slots_per_request(rollback_mode: str, num_draft_tokens: int) -> int:
    """State slots a request holds beside its own for speculative decoding: none without
    (``rollback_mode`` ""), a checkpoint with ``replay``, one per draft with ``states``."""
    return {"": 0, "replay": 1, "states": num_draft_tokens}[rollback_mode]


class CacheManager:
    """Grows, reuses and releases requests' blocks and slots.

    Args:
        blocks: packed MLA block pool.
        slots: KDA state-slot pool (one per running request).
        snapshots: KDA snapshot store, or None to disable prefix caching.
        snapshot_stride: take a snapshot every this many blocks.
        dcp: the decode-context-parallel degree: a block id covers ``dcp * blocks.block_size`` tokens.
        host: the host tier's connector, or None (no tier).
        prefetch_gate: when a request whose prefix is prefetched from the L3 may be admitted (default:
            ``best_effort``, never held back).
        rollback_mode: speculative decoding's KDA rollback (``EngineConfig.rollback``): ``replay``,
            ``states``, or "" without speculation.
        num_draft_tokens: the most drafts of a verify step (the ``states`` slots per request).
    """

    def __init__(
        self,
        blocks: BlockPool,
        slots: StateSlotPool,
        snapshots: SnapshotStore | None = None,
        snapshot_stride: int = 1,
        dcp: int = 1,
        host: HostCacheConnector | None = None,
        prefetch_gate: PrefetchGate | None = None,
        rollback_mode: str = "",
        num_draft_tokens: int = 0,
    ):
        self.blocks = blocks
        self.rollback_mode = rollback_mode
        self.num_spec_slots = spec_slots_per_request(rollback_mode, num_draft_tokens)
        self.block_tokens = dcp * blocks.block_size
        self.slots = slots
        self.snapshots = snapshots
        self.snapshot_stride = snapshot_stride
        self.policy = SnapshotPolicy(self.block_tokens, snapshot_stride)
        self.has_state = bool(slots.layout.fields)
        self._state_copies: list[StateCopy] | None = None  # None: not recorded (one rank)
        self.host = host
        self.counters = host.counters if host is not None else CacheCounters()
        if host is not None:
            blocks.on_evict = host.offload
        self.prefetch_gate = prefetch_gate or PrefetchGate(BEST_EFFORT, 0)

    def record_state_copies(self) -> None:
        """From now on keep every snapshot save and restore for ``take_state_copies``."""
        self._state_copies = []

    def take_state_copies(self) -> tuple[StateCopy, ...]:
        """The state copies made since the last call, in order (none when not recording)."""
        copies = tuple(self._state_copies or ())
        if self._state_copies is not None:
            self._state_copies.clear()
        return copies

    def _copied(self, kind: str, slot: int, snapshot: int | None) -> None:
        if self._state_copies is not None and snapshot is not None:
            self._state_copies.append(StateCopy(kind, slot, snapshot))

    @classmethod
    def for_model(
        cls,
        config: EngineConfig,
        model: CausalLM,
        scratch: bool = False,
        redis_url: str = "",
        num_draft_tokens: int = 0,
        cluster_secret: str = "",
        internal_tls: InternalTls | None = None,
    ) -> "CacheManager":
        """The pools ``config`` asks for, laid out for ``model`` (its shard, on a parallel rank) on
        ``config.device`` (a pipeline stage's layers only); ``scratch``: a spare block and slot for
        CUDA-graph padding rows; ``redis_url``: the Redis of the own tier's L3 (``redis_l3_gib``);
        ``num_draft_tokens``: speculative decoding's most drafts per step (0: none), which with
        ``config.rollback`` sets the slots per seat beside its own;
        ``cluster_secret``: sent on every call to the ``baton cache`` at ``host_cache_address``, over
        ``internal_tls`` when the cluster has it."""
        dtype = model.dtype
        mode = config.rollback if num_draft_tokens else ""
        spec_slots = spec_slots_per_request(mode, num_draft_tokens)
        open_rows = FIXED_CHUNK if config.batch_invariant else 0
        layers = stage_position(model.parallel, model.config.num_hidden_layers)[0]  # all at --pp 1
        blocks = BlockPool(
            stage_layout(block_layout(model.config, config.block_size, dtype, config.kv_format), layers),
            config.block_size,
            config.pool_blocks,
            config.device,
            scratch=scratch,
            tenant_reserve=config.tenant_cache_reserve_blocks,
        )
        slots = StateSlotPool(
            stage_layout(slot_layout(model.config, dtype, open_rows, model.parallel.tp), layers),
            config.max_num_seqs * (1 + spec_slots),
            config.device,
            scratch=scratch,
        )
        snapshots = None
        if config.enable_prefix_caching:
            kept = config.num_snapshots or config.max_num_seqs
            # The snapshots a tenant's reserved blocks need: one per snapshot stride.
            reserve = -(-config.tenant_cache_reserve_blocks // max(1, config.snapshot_stride))
            snapshots = SnapshotStore(slots.layout, kept, config.device, tenant_reserve=reserve)
        host = None
        if config.host_cache_address:  # one rank only: EngineConfig refuses a tier on a parallel engine
            host = HostCacheConnector.remote(
                config.host_cache_address,
                blocks,
                slots,
                cluster_secret=cluster_secret,
                internal_tls=internal_tls,
            )
        if config.host_cache_gib > 0:
            host = HostCacheConnector.in_process(
                blocks,
                slots,
                config.host_cache_gib,
                config.host_cache_kda_fraction,
                redis_url=redis_url,
                l3_gib=config.redis_l3_gib,
                tenant_reserve_pages=config.tenant_cache_reserve_blocks,  # a page holds one block
                snapshot_stride=config.snapshot_stride,
            )
        gate = PrefetchGate(config.prefetch_policy, config.prefetch_timeout_ms)
        return cls(
            blocks, slots, snapshots, config.snapshot_stride, config.dcp, host, gate, mode, num_draft_tokens
        )

    def apply_state_copies(self, copies: tuple[StateCopy, ...]) -> None:
        """A follower rank: make the KDA state copies rank 0's cache manager recorded, in order."""
        for copy in copies:
            slot, snapshot = self.slots.storage[copy.slot], self.snapshots.pool.storage[copy.snapshot]
            (snapshot if copy.kind == SAVE else slot).copy_(slot if copy.kind == SAVE else snapshot)

    @property
    def prefix_caching(self) -> bool:
        return self.snapshots is not None

    def blocks_needed(self, request: Request, new_tokens: int) -> int:
        """Extra blocks the request needs to cache ``new_tokens`` more tokens."""
        total = request.num_computed + new_tokens
        return max(0, -(-total // self.block_tokens) - len(request.block_table))

    def can_grow(self, request: Request, new_tokens: int) -> bool:
        return self.blocks.can_allocate(self.blocks_needed(request, new_tokens), tenant=request.tenant)

    def grow(self, request: Request, new_tokens: int) -> None:
        """Give the request room for ``new_tokens`` more tokens. ``can_grow`` first."""
        request.block_table.extend(
            self.blocks.allocate(self.blocks_needed(request, new_tokens), tenant=request.tenant)
        )

    def find_prefix(self, request: Request) -> PrefixHit:
        """The longest reusable cached prefix of a waiting request (no side effects).

        At least one token is left to compute (its logits are needed). With KDA layers the match is
        cut back to the last block boundary that has a state snapshot.
        """
        if not self.prefix_caching or request.num_computed:
            return PrefixHit()
        hashes = self._prompt_hashes(request)
        hit = self._device_hit(hashes)
        if self.host is None or not hashes:
            return hit
        match = self.host.match(hashes)
        depth = match.usable_depth
        kv_blocks = max(hit.kv_blocks, match.kv_depth)
        if depth <= hit.num_blocks:
            return dataclasses.replace(hit, kv_blocks=kv_blocks, tier_match=match, tier_blocks=len(hashes))
        # The tier restores the chain to ``depth``: share the device's leading blocks, load the rest.
        shared = self._device_blocks(hashes[:depth])
        snapshot = hashes[depth - 1] if self.has_state else None
        return PrefixHit(
            shared,
            snapshot,
            depth - len(shared),
            from_host=True,
            kv_blocks=kv_blocks,
            tier_match=match,
            tier_blocks=len(hashes),
        )

    def find_held_prefix(self, request: Request) -> PrefixHit:
        """A reservation's hit: the leading prompt blocks whose KV the device pool or, after it, the
        host tier holds, whether or not a KDA snapshot ends them (the handoff brings the state at the
        prompt's end; only the blocks after the hit are sent). No side effects."""
        if not self.prefix_caching:
            return PrefixHit(kv_only=True)
        hashes = self._prompt_hashes(request)
        shared = self._device_blocks(hashes)
        match = self.host.match(hashes) if self.host is not None and hashes else None
        depth, counted = (match.kv_depth, len(hashes)) if match is not None else (0, 0)
        hit = PrefixHit(shared, kv_blocks=len(shared), kv_only=True, tier_match=match, tier_blocks=counted)
        if depth <= len(shared):
            return hit
        return dataclasses.replace(hit, host_blocks=depth - len(shared), from_host=True, kv_blocks=depth)

    def _prompt_hashes(self, request: Request) -> list[bytes]:
        """The hashes of the prompt blocks a hit may cover: all full blocks but one token's worth (a
        request computes at least its last prompt token)."""
        return self._hashes(request)[: (request.num_tokens - 1) // self.block_tokens]

    def prefetch(self, request: Request) -> None:
        """A request arrived: start bringing its prefix from the L3 into the host tier while it queues
        (nothing without an L3, or when the device pool holds the whole prefix)."""
        if self.host is None or self.host.prefetcher is None or not self.prefix_caching:
            return
        hashes = self._prompt_hashes(request)
        if len(self._device_blocks(hashes)) == len(hashes):
            return
        handle = self.host.start_prefetch(hashes, request.tenant)
        if handle is not None:
            self.prefetch_gate.start(request.request_id, handle)

    def ready(self, request: Request) -> bool:
        """Whether the prefetch policy lets the waiting ``request`` be admitted now."""
        return self.prefetch_gate.ready(request.request_id)

    def prefetch_hold_s(self, request: Request) -> float | None:
        """How long the prefetch policy still holds the waiting ``request`` at most (seconds; ``math.inf``:
        until its prefetch is over), or None when ``ready`` would let it in (``PrefetchGate.hold_s``)."""
        return self.prefetch_gate.hold_s(request.request_id)

    def take_prefetch_outcomes(self) -> list[PrefetchOutcome]:
        """Prefetch outcomes since the last call (for the worker's metrics)."""
        return self.prefetch_gate.take_outcomes()

    def _device_blocks(self, hashes: list[bytes]) -> tuple[int, ...]:
        found = []
        for block_hash in hashes:
            block = self.blocks.lookup(block_hash)
            if block is None:
                break
            found.append(block)
        return tuple(found)

    def _device_hit(self, hashes: list[bytes]) -> PrefixHit:
        """The device pool's own hit on ``hashes`` (cut back to a snapshot with KDA state)."""
        found = self._device_blocks(hashes)
        if not self.has_state:
            return PrefixHit(found, kv_blocks=len(found))
        for count in range(len(found), 0, -1):
            if self.snapshots.lookup(hashes[count - 1]) is not None:
                return PrefixHit(found[:count], hashes[count - 1], kv_blocks=len(found))
        return PrefixHit(kv_blocks=len(found))

    def branch_point(self, hit: PrefixHit) -> int:
        """Where a request started from ``hit`` leaves the cached KV it matched, in tokens (0: it does
        not go past its hit's snapshot); a snapshot is taken there."""
        branch = hit.kv_blocks * self.block_tokens
        return branch if branch > hit.num_blocks * self.block_tokens else 0

    def can_admit(self, request: Request, hit: PrefixHit, new_tokens: int) -> bool:
        """Whether ``admit`` can start the request from ``hit`` and cache ``new_tokens`` more tokens."""
        size = self.block_tokens
        needed = -(-(hit.num_blocks * size + new_tokens) // size) - len(hit.block_ids)
        kept_cached = sum(1 for block in hit.block_ids if self.blocks.ref_counts[block] == 0)
        slots_free = self.slots.num_free >= self.slots_per_request
        return slots_free and self.blocks.can_allocate(needed, reserved=kept_cached, tenant=request.tenant)

    @property
    def slots_per_request(self) -> int:
        """State slots an admitted request holds: its own, and its ``spec_slots`` when speculating."""
        return 1 + self.num_spec_slots

    def admit(self, request: Request, hit: PrefixHit, new_tokens: int) -> None:
        """Start a waiting request from ``hit``: share its blocks, load the host tier's part, restore its
        KDA state, make room."""
        self.blocks.acquire(list(hit.block_ids))
        request.block_table = list(hit.block_ids)
        request.num_registered = len(hit.block_ids)
        request.slot = self.slots.allocate()
        request.spec_slots = [self.slots.allocate() for _ in range(self.num_spec_slots)]
        request.num_cached_tokens_host = 0
        if hit.tier_match is not None:
            self.host.record_lookup(hit.tier_match, hit.tier_blocks, with_state=not hit.kv_only)
        if hit.from_host and not self._load_from_host(request, hit):
            hashes = self._hashes(request)[: hit.num_blocks]
            fallback = PrefixHit(hit.block_ids, kv_only=True) if hit.kv_only else self._device_hit(hashes)
            self.blocks.free(request.block_table[len(fallback.block_ids) :])
            del request.block_table[len(fallback.block_ids) :]
            request.num_registered = len(fallback.block_ids)
            hit = fallback
        request.num_computed = request.num_cached_tokens = len(request.block_table) * self.block_tokens
        request.branch_tokens = self.branch_point(hit)
        self._count_hit(hit)
        if hit.snapshot_hash is not None and not hit.from_host:
            snapshot = self.snapshots.restore(hit.snapshot_hash, self.slots.storage[request.slot])
            self._copied(RESTORE, request.slot, snapshot)
        self.grow(request, new_tokens)

    def _load_from_host(self, request: Request, hit: PrefixHit) -> bool:
        """Lease the tier's pages of ``hit``, then copy them into new blocks and the slot. False (nothing
        changed) when a page is gone or failed its checksum, or the rows could not be moved."""
        hashes = self._hashes(request)[: hit.num_blocks]
        leases = self.host.lease(hashes, len(hit.block_ids), with_state=not hit.kv_only)
        try:
            if not self.host.complete(leases, hit.host_blocks):
                self.host.fell_back(leases)
                return False
            # may offload device blocks: pages are leased
            loaded = self.blocks.allocate(hit.host_blocks, tenant=request.tenant)
            if not self.host.copy_in(leases, loaded, request.slot):  # the rows did not move: a miss
                self.blocks.free(loaded)
                return False
        finally:
            self.host.release(leases)
        request.block_table.extend(loaded)
        request.num_cached_tokens_host = hit.host_blocks * self.block_tokens
        return True

    def _count_hit(self, hit: PrefixHit) -> None:
        """Count the tokens an admitted request starts from, by where their KV and KDA state came from."""
        size = self.block_tokens
        self.counters.hit(DEVICE, KV, len(hit.block_ids) * size)
        self.counters.hit(HOST, KV, hit.host_blocks * size)
        if self.has_state and hit.snapshot_hash is not None:
            self.counters.hit(HOST if hit.from_host else DEVICE, KDA, hit.num_blocks * size)

    def counts(self) -> CacheCounts:
        """The prefix cache's counters now (``cache_counters.py``), with the tier's reachability."""
        return self.host.counts() if self.host is not None else self.counters.counts()

    def record_progress(self, request: Request) -> None:
        """Register the request's newly completed blocks; snapshot its state where the snapshot policy
        asks (``cache/snapshot_policy.py``); write both through to the host tier."""
        if not self.prefix_caching:
            return
        hashes = self._hashes(request)
        full = request.num_computed // self.block_tokens
        for index in range(request.num_registered, full):
            self.blocks.register(request.block_table[index], hashes[index], request.tenant)
        if self.host is not None:
            start = request.num_registered
            self.host.save_blocks(hashes[start:full], request.block_table[start:full], request.tenant)
        request.num_registered = full
        reason = self.policy.reason(request, request.num_computed) if self.has_state else None
        if reason is not None:
            state = self.slots.storage[request.slot]
            snapshot = self.snapshots.save(hashes[full - 1], state, request.tenant)
            self._copied(SAVE, request.slot, snapshot)
            if self.host is not None and reason != DECODE:
                self.host.save_state(hashes[full - 1], state, reason, request.tenant)

    def record_end(self, request: Request) -> None:
        """At the end of a request, snapshot its state if it stops exactly on a block boundary, and
        write the snapshot at its last block boundary back to the host tier (the next turn's hit)."""
        size = self.block_tokens
        if self.prefix_caching and self.has_state and request.slot is not None and request.num_computed:
            full = request.num_computed // size
            last_hash = self._hashes(request)[full - 1] if full else None
            if request.num_computed % size == 0:
                snapshot = self.snapshots.save(last_hash, self.slots.storage[request.slot], request.tenant)
                self._copied(SAVE, request.slot, snapshot)
            last = self.snapshots.lookup(last_hash) if full else None
            if self.host is not None and last is not None:
                self.host.save_state(last_hash, self.snapshots.pool.storage[last], TURN_END, request.tenant)

    def release(self, request: Request) -> None:
        """Return everything the request holds; registered blocks stay cached for later matches."""
        self.prefetch_gate.forget(request.request_id)
        self.blocks.free(request.block_table)
        request.block_table = []
        if request.slot is not None:
            self.slots.free(request.slot)
            request.slot = None
        for slot in request.spec_slots:
            self.slots.free(slot)
        request.spec_slots = []
        request.num_computed = 0
        request.num_registered = 0

    def rollback(self, request: Request) -> None:
        """Restore the request's KDA state from its checkpoint slot: undo a verify step's drafts (the
        target's KDA layers copied the state there after the step's tail rows). ``replay`` only."""
        self.slots.copy_slot(request.spec_slots[0], request.slot)

    def commit_drafts(self, request: Request, num_accepted: int) -> None:
        """Make the KDA state after the request's last accepted draft its own (``states`` only): the
        verify step kept it in ``spec_slots[num_accepted - 1]``; with none accepted the slot already
        holds the state after the tail."""
        if num_accepted:
            self.slots.copy_slot(request.spec_slots[num_accepted - 1], request.slot)

    def total_tokens(self) -> int:
        """Context tokens the block pool holds in all (over the DCP ranks, each storing its share)."""
        return self.blocks.num_blocks * self.block_tokens

    def check_integrity(self) -> None:
        self.blocks.check_integrity()
        self.slots.check_integrity()
        if self.snapshots is not None:
            self.snapshots.check_integrity()
        if self.host is not None:
            self.host.check_integrity()

    def _hashes(self, request: Request) -> list[bytes]:
        request.block_hashes = extend_chain(
            request.block_hashes, request.all_ids, self.block_tokens, request.cache_root
        )
        return request.block_hashes
