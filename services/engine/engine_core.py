"""The engine loop: admit requests, schedule a step, run it, apply the results."""

import dataclasses
import hashlib
import itertools
from pathlib import Path

import torch

from kernels.kda.fixed_chunk import CHUNK as FIXED_CHUNK
from services.engine.cache.block_hash import chain_root
from services.engine.cache.block_pool import BlockPool
from services.engine.cache.layout import block_layout, slot_layout
from services.engine.cache.snapshot_store import SnapshotStore
from services.engine.cache.state_pool import StateSlotPool
from services.engine.checkpoint.loader import load_model
from services.engine.sampling import SamplingParams

from .cache_manager import CacheManager
from .engine_config import EngineConfig
from .model_runner import ModelRunner
from .request import Request
from .scheduler import Scheduler


class EngineCore:
    """One model, its cache pools, a scheduler and a runner.

    Args:
        config: the validated engine configuration.
    """

    def __init__(self, config: EngineConfig):
        self.config = config
        dtype = getattr(torch, config.dtype) if config.dtype else None
        self.model = load_model(config.model, device=config.device, dtype=dtype)
        self.model.set_batch_invariant(config.batch_invariant)
        model_dtype = self.model.lm_head.weight.dtype
        open_rows = FIXED_CHUNK if config.batch_invariant else 0
        blocks = BlockPool(
            block_layout(self.model.config, config.block_size, model_dtype, config.kv_format),
            config.block_size,
            config.pool_blocks,
            config.device,
        )
        slots = StateSlotPool(
            slot_layout(self.model.config, model_dtype, open_rows), config.max_num_seqs, config.device
        )
        snapshots = None
        if config.enable_prefix_caching:
            snapshots = SnapshotStore(
                slots.layout, config.num_snapshots or config.max_num_seqs, config.device
            )
        self.cache = CacheManager(blocks, slots, snapshots, config.snapshot_stride)
        self.model_fingerprint = _fingerprint(config.model)
        self.scheduler = Scheduler(
            self.cache, config.max_num_seqs, config.max_num_batched_tokens, config.max_model_len
        )
        self.runner = ModelRunner(self.model, self.cache)
        self._ids = itertools.count()

    def add_request(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        tenant: str = "",
        adapter: str = "",
    ) -> Request:
        """Validate and queue a request. ``tenant`` and ``adapter`` salt its prefix-cache hashes.

        Raises:
            ValueError: an out-of-vocabulary id, an empty prompt or one that can never fit.
        """
        request = self._new_request(prompt_ids, params, request_id, tenant, adapter)
        self.scheduler.add(request)
        return request

    def _new_request(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str | None, tenant: str, adapter: str
    ) -> Request:
        vocab = self.model.config.vocab_size
        for position, token in enumerate(prompt_ids):
            if not isinstance(token, int) or not 0 <= token < vocab:
                raise ValueError(
                    f"prompt_ids: id {token!r} at position {position} is outside the vocabulary [0, {vocab})"
                )
        request = Request(
            request_id=request_id if request_id is not None else f"req-{next(self._ids)}",
            prompt_ids=list(prompt_ids),
            params=params,
            stop_ids=frozenset(self.model.config.eos_token_ids),
            cache_root=chain_root(self.model_fingerprint, adapter, tenant),
        )
        return request

    def reserve(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str, tenant: str = ""
    ) -> Request:
        """Decode side of a handoff: hold room for the prompt's state (see ``services.engine.handoff``).

        Raises:
            ValueError: a bad request (as ``add_request``).
            NoCapacity: nothing free right now.
        """
        request = self._new_request(prompt_ids, params, request_id, tenant, "")
        self.scheduler.reserve(request)
        return request

    def cached_prefix_tokens(self, prompt_ids: list[int], tenant: str = "") -> int:
        """Leading prompt tokens this engine's prefix cache would serve now (a lookup, no side effects).

        Raises:
            ValueError: a bad prompt (as ``add_request``).
        """
        request = self._new_request(prompt_ids, SamplingParams(), None, tenant, "")
        return self.cache.find_prefix(request).num_blocks * self.cache.blocks.block_size

    def add_prefill_only(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str, tenant: str = ""
    ) -> Request:
        """Prefill side of a handoff: compute the prompt and its first token, keep the cache until
        ``release_held``. ``params`` are the request's own (its seed and logprob settings apply)."""
        first_only = dataclasses.replace(params, max_tokens=1, stop=(), stop_token_ids=())
        request = self._new_request(prompt_ids, first_only, request_id, tenant, "")
        request.hold_cache = True
        self.scheduler.add(request)
        return request

    def abort(self, request_id: str) -> None:
        self.scheduler.abort(request_id)

    def step(self) -> list[Request]:
        """Run one step; returns the requests that finished in it."""
        output = self.scheduler.schedule()
        if not output.chunks:
            return []
        sampled = self.runner.execute(output, self.scheduler.requests)
        return self.scheduler.update(output, sampled)

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def check_integrity(self) -> None:
        """Pools consistent, and with no request in flight, nothing held."""
        self.cache.check_integrity()
        if not self.has_unfinished:
            assert self.cache.blocks.num_free == self.cache.blocks.num_blocks, "blocks leaked"
            assert self.cache.slots.num_free == self.cache.slots.num_slots, "state slots leaked"


def _fingerprint(model_dir: str) -> str:
    """Identifies the model in prefix-cache hashes: its resolved folder and config.json contents."""
    folder = Path(model_dir).resolve()
    return hashlib.sha256(str(folder).encode() + (folder / "config.json").read_bytes()).hexdigest()
