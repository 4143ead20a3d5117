"""Frozen views of an engine that ``EngineService`` hands out: its load, its pools, how it runs.

Each is taken on the engine loop thread between steps, so its numbers are one consistent picture;
none holds a reference into the scheduler or the cache.
"""

from dataclasses import dataclass

from .cache.block_pool import CacheEvent
from .cache_counters import CacheCounts
from .engine_core import EngineCore
from .speculative.spec_counters import SpecCounts

MAX_LISTED_IDS = 64  # request ids a ``PoolState`` names at most


@dataclass(frozen=True)
class WorkerLoad:
    """A worker's load after one engine pass: what the router scores it by, and the pool gauges."""

    running: int  # running or reserved (a reservation holds a sequence seat)
    waiting: int
    free_blocks: int
    total_blocks: int
    free_slots: int
    total_slots: int
    block_size: int  # context tokens a block id covers (dcp x the pool's block size)
    queued_prompt_tokens: int  # prompt tokens of waiting and running requests not yet computed
    adapters: tuple[str, ...] = ()  # LoRA adapters loaded, sorted

    @property
    def used_blocks(self) -> int:
        return self.total_blocks - self.free_blocks

    @property
    def used_slots(self) -> int:
        return self.total_slots - self.free_slots


@dataclass(frozen=True)
class EnginePass:
    """What one pass (a step or a command) left behind, for the worker's observers."""

    load: WorkerLoad
    expired: tuple[str, ...]  # reservations the TTL freed in this pass
    queue_times: tuple[float, ...]  # arrival-to-first-step seconds of requests started since the last pass
    cache_events: tuple[CacheEvent, ...]  # prefix-cache blocks inserted and evicted in this pass, in order
    cache_counts: CacheCounts  # the prefix cache's and host tier's counters since start (totals)
    prefetches: tuple = ()  # PrefetchOutcome's since the last pass (services/engine/prefetch_gate.py)
    spec_counts: SpecCounts | None = None  # speculative decoding's counters (totals); None: no drafting


@dataclass(frozen=True)
class PoolState:
    """The pools' consistency and what they still hold (``CheckIntegrity``)."""

    ok: bool
    error: str  # why ``check_integrity`` failed; empty when ``ok``
    used_blocks: int
    cached_blocks: int  # free but kept by the prefix cache (evictable)
    total_blocks: int
    used_slots: int
    total_slots: int
    running: int
    waiting: int
    reserved: int
    held: int
    request_ids: tuple[str, ...]  # every request the engine knows, sorted, at most ``MAX_LISTED_IDS``


@dataclass(frozen=True)
class EngineInfo:
    """How the engine runs (fixed at start)."""

    kernels: str
    cuda_graphs: bool
    model_fingerprint: str  # the prefix hash chain's salt
    prefix_caching: bool


def load_of(engine: EngineCore) -> WorkerLoad:
    """``engine``'s load now (loop thread)."""
    scheduler, cache = engine.scheduler, engine.cache
    queued = sum(max(0, len(r.prompt_ids) - r.num_computed) for r in (*scheduler.waiting, *scheduler.running))
    return WorkerLoad(
        running=len(scheduler.running) + len(scheduler.reserved),
        waiting=len(scheduler.waiting),
        free_blocks=cache.blocks.num_free,
        total_blocks=cache.blocks.num_blocks,
        free_slots=cache.slots.num_free,
        total_slots=cache.slots.num_slots,
        block_size=cache.block_tokens,
        queued_prompt_tokens=queued,
        adapters=tuple(engine.adapters.names),
    )


def pool_state_of(engine: EngineCore) -> PoolState:
    """``engine``'s pools now (loop thread)."""
    scheduler, blocks, slots = engine.scheduler, engine.cache.blocks, engine.cache.slots
    try:
        engine.cache.check_integrity()
        ok, error = True, ""
    except AssertionError as failure:
        ok, error = False, str(failure) or "check_integrity failed"
    known = sorted({*scheduler.requests, *scheduler.held})
    return PoolState(
        ok=ok,
        error=error,
        used_blocks=sum(1 for count in blocks.ref_counts if count > 0),
        cached_blocks=len(blocks.evictable),
        total_blocks=blocks.num_blocks,
        used_slots=slots.num_slots - slots.num_free,
        total_slots=slots.num_slots,
        running=len(scheduler.running),
        waiting=len(scheduler.waiting),
        reserved=len(scheduler.reserved),
        held=len(scheduler.held),
        request_ids=tuple(known[:MAX_LISTED_IDS]),
    )


def spec_counts_of(engine: EngineCore) -> SpecCounts | None:
    """``engine``'s speculative-decoding totals now (loop thread); None when it drafts nothing."""
    counters = getattr(engine, "spec_counters", None)  # an engine core without speculation lacks it
    return None if counters is None else counters.counts()


def info_of(engine: EngineCore) -> EngineInfo:
    return EngineInfo(
        engine.config.kernel_backend,
        engine.runner.graphs is not None,
        engine.model_fingerprint,
        engine.cache.prefix_caching,
    )
