"""The engine loop: admit requests, schedule a step, run it, apply the results."""

import dataclasses
import itertools
import time

import torch

from common.internal_tls import InternalTls
from common.prefix_hash import chain_root
from common.sampling_params import SamplingParams
from services.engine.adapters.lora_adapter import LoraAdapter
from services.engine.adapters.registry import AdapterInUse, AdapterRegistry
from services.engine.checkpoint.fingerprint import checkpoint_fingerprint
from services.engine.checkpoint.loader import load_model
from services.engine.model.backends import check_kernels
from services.engine.model.causal_lm import CausalLM
from services.engine.parallel.context import ParallelContext
from services.engine.parallel.parallel_check import check_parallel
from services.engine.parallel.rank_group import RankGroup, rank_device

from .cache_manager import CacheManager
from .cuda_graphs import DecodeGraphs, capture_sizes, use_cuda_graphs
from .draft_handoff import draft_arrived, reserve_draft
from .engine_config import EngineConfig
from .model_runner import ModelRunner
from .request import Request
from .sampling.grammar import GrammarCompiler
from .scheduler import SampledToken, Scheduler, SchedulerOutput
from .speculative.draft_compatibility import check_draft_compatible
from .speculative.proposal import DraftProposer
from .speculative.spec_counters import SpecCounters
from .speculative.spec_policy import SpecPolicy


def load_engine_model(config: EngineConfig, context: ParallelContext) -> CausalLM:
    """``config.model``'s shard for ``context`` (the whole model on one rank) on ``config.device``, with
    the config's numerics and kernels; rank 0 and every follower rank load through here."""
    dtype = getattr(torch, config.dtype) if config.dtype else None
    model = load_model(config.model, device=rank_device(config, context.rank), dtype=dtype, parallel=context)
    model.set_batch_invariant(config.batch_invariant)
    model.set_kernels(config.kernel_backend, config.kv_format)
    return model


class EngineCore:
    """One model, its cache pools, a scheduler and a runner.

    Args:
        config: the validated engine configuration.
        model: an already built model on ``config.device`` (random real-shape presets); None loads
            ``config.model`` from disk.
        redis_url: the Redis of the L3 below the engine's own host tier (``config.redis_l3_gib``; the
            worker's ``--redis-url``).
        proposer: speculative decoding's drafts (tests pass a scripted one); None builds the draft
            model's (``speculative/draft_model.py``) when ``config.draft_model`` is set, else none.

    With a proposer every step first drafts for the running requests past their prompt, and the
    target verifies the drafts in the step (``scheduler.py``); ``spec_counters`` counts the verifies.
    How many tokens a step drafts is ``config.num_draft_tokens`` (``spec_policy`` fixed), or what
    ``spec_policy`` (a ``SpecPolicy``, adaptive) chooses from the times ``clock`` measures (tests set a
    fake ``clock``).

    With ``config.world_size > 1`` this process is rank 0 of a ``RankGroup``: the follower ranks start
    here, each loads its shard, and every step's forward runs on all of them; ``close`` stops them.

    Raises:
        ValueError: a kernel backend that cannot run here (naming ``--kernels``), or a parallel layout
            that cannot (``check_parallel``, naming the flag), before any weight is read; a proposer on
            a parallel engine (naming ``--draft-model``).
    """

    def __init__(
        self,
        config: EngineConfig,
        model: CausalLM | None = None,
        redis_url: str = "",
        proposer: DraftProposer | None = None,
        cluster_secret: str = "",
        internal_tls: InternalTls | None = None,
    ):
        self.config = config
        if proposer is not None and config.world_size > 1:
            raise ValueError(
                f"draft_model: speculative decoding is not supported yet on a parallel engine "
                f"({config.world_size} ranks); drop --draft-model or run one rank"
            )
        check_kernels(config.kernel_backend, config.device, config.batch_invariant)
        prebuilt = model is not None
        if proposer is None and config.draft_model and not prebuilt:  # before any weight is read
            check_draft_compatible(config.model, config.draft_model)
        check_parallel(config, prebuilt=prebuilt)
        # Several ranks: the followers start now and load their shards beside this one (rank 0).
        self.ranks = RankGroup(config) if config.world_size > 1 else None
        try:
            if not prebuilt:
                context = self.ranks.context if self.ranks else ParallelContext.single()
                model = load_engine_model(config, context)
            else:
                model.set_batch_invariant(config.batch_invariant)
                model.set_kernels(config.kernel_backend, config.kv_format)
        except BaseException:
            self.close()
            raise
        self.model = model
        use_graphs = use_cuda_graphs(config, self.model, parallel=self.ranks is not None)
        if proposer is None and config.draft_model:
            from .speculative.draft_model import DraftModelProposer  # the draft model's own stack

            proposer = DraftModelProposer(config, self.model, cuda_graphs=use_graphs)
        self.proposer = proposer
        self.spec_counters = SpecCounters(proposer.num_draft_tokens) if proposer is not None else None
        adaptive = proposer is not None and config.spec_policy == "adaptive"
        self.spec_policy = SpecPolicy(proposer.num_draft_tokens) if adaptive else None
        self.clock = time.perf_counter
        self.cache = CacheManager.for_model(
            config,
            self.model,
            scratch=use_graphs,
            redis_url=redis_url,
            num_draft_tokens=proposer.num_draft_tokens if proposer is not None else 0,
            cluster_secret=cluster_secret,
            internal_tls=internal_tls,
        )
        self.model_fingerprint = (
            checkpoint_fingerprint(config.model) if not prebuilt else f"built:{config.model}"
        )
        # structured output: compiled grammars for this checkpoint's tokenizer (built at first use)
        model_config = self.model.config
        self.grammars = GrammarCompiler(config.model, model_config.vocab_size, model_config.eos_token_ids)
        self.scheduler = Scheduler(
            self.cache, config.max_num_seqs, config.max_num_batched_tokens, config.max_model_len, proposer
        )
        self.adapters = AdapterRegistry(self.model)
        for name, folder in config.adapter_folders().items():
            self.adapters.load(name, folder)
        self.runner = ModelRunner(self.model, self.cache, adapters=self.adapters, ranks=self.ranks)
        if self.ranks is not None:
            self.cache.record_state_copies()
        if use_graphs:
            sizes = capture_sizes(config.max_num_seqs)
            self.runner.graphs = DecodeGraphs(self.model, self.runner.paged, sizes, config.max_model_len)
            self.runner.graphs.capture()
            if proposer is not None and self.cache.rollback_mode == "states":  # fixed-shape verify steps
                for k in range(1, proposer.num_draft_tokens + 1):
                    graphs = DecodeGraphs(
                        self.model, self.runner.paged, sizes, config.max_model_len, num_draft=k
                    )
                    graphs.capture()
                    self.runner.verify_graphs[k] = graphs
        self._ids = itertools.count()

    def add_request(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        tenant: str = "",
        adapter: str = "",
        resumed_tokens: int = 0,
    ) -> Request:
        """Validate and queue a request. ``adapter`` names a loaded LoRA adapter ("" for the base
        model) applied to this request's rows only; ``tenant`` and ``adapter`` salt its prefix-cache hashes;
        ``resumed_tokens``: the prompt's last tokens were generated by this request elsewhere (it
        migrated), so its seeded sampling continues after them.

        Raises:
            ValueError: an out-of-vocabulary id, an empty prompt or one that can never fit, or an
                adapter that is not loaded (``UnknownAdapter``, naming ``adapter``).
        """
        request = self._new_request(prompt_ids, params, request_id, tenant, adapter, resumed_tokens)
        self.scheduler.add(request)
        return request

    def _new_request(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str | None,
        tenant: str,
        adapter: str,
        resumed_tokens: int = 0,
    ) -> Request:
        if not 0 <= resumed_tokens < max(len(prompt_ids), 1):
            raise ValueError(
                f"resumed_tokens: must be in [0, {len(prompt_ids)}) (fewer than the prompt's tokens), "
                f"got {resumed_tokens}"
            )
        salt = self.adapters.get(adapter).cache_salt if adapter else ""
        vocab = self.model.config.vocab_size
        for position, token in enumerate(prompt_ids):
            if not isinstance(token, int) or not 0 <= token < vocab:
                raise ValueError(
                    f"prompt_ids: id {token!r} at position {position} is outside the vocabulary [0, {vocab})"
                )
        for token, _ in params.logit_bias:
            if token >= vocab:
                raise ValueError(f"logit_bias: id {token} is outside the vocabulary [0, {vocab})")
        grammar = self.grammars.matcher(params.structured_output) if params.constrained else None
        request = Request(
            request_id=request_id if request_id is not None else f"req-{next(self._ids)}",
            prompt_ids=list(prompt_ids),
            params=params,
            stop_ids=frozenset(self.model.config.eos_token_ids),
            cache_root=chain_root(self.model_fingerprint, salt, tenant),
            tenant=tenant,
            adapter=adapter,
            num_resumed=resumed_tokens,
            grammar=grammar,
        )
        return request

    def reserve(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str,
        tenant: str = "",
        resumed_tokens: int = 0,
        adapter: str = "",
    ) -> Request:
        """Decode side of a handoff: hold room for the prompt's state (see ``services.engine.handoff``).
        ``resumed_tokens`` and ``adapter`` as in ``add_request``.

        With a draft model the request's draft seat is reserved too (blocks for the prompt, its slots).

        Raises:
            ValueError: a bad request (as ``add_request``).
            NoCapacity: nothing free right now.
        """
        request = self._new_request(prompt_ids, params, request_id, tenant, adapter, resumed_tokens)
        self.scheduler.reserve(request)
        try:  # a draft model's seat, for draft rows a handoff may bring
            reserve_draft(self.proposer, request)
        except BaseException:
            self.scheduler.abort(request.request_id)
            raise
        return request

    def complete_reserved(self, request_id: str, first: SampledToken, with_draft: bool = False) -> Request:
        """Decode side: the reservation's state has arrived; decode from ``first`` (the prefill's token).
        ``with_draft``: the handoff wrote the draft seat's prompt rows too (``draft_handoff.py``), so
        the draft's first proposal computes only what follows the prompt; else it catches up.

        Raises:
            KeyError: no such reserved request.
            ValueError: ``with_draft`` on an engine without a draft model.
        """
        if with_draft:
            draft_arrived(self.proposer, self.scheduler.reserved[request_id])
        return self.scheduler.complete_reserved(request_id, first)

    def cached_prefix_tokens(self, prompt_ids: list[int], tenant: str = "", adapter: str = "") -> int:
        """Leading prompt tokens this engine's prefix cache would serve now (a lookup, no side effects).

        Raises:
            ValueError: a bad prompt (as ``add_request``).
        """
        request = self._new_request(prompt_ids, SamplingParams(), None, tenant, adapter)
        return self.cache.find_prefix(request).num_blocks * self.cache.block_tokens

    def add_prefill_only(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str,
        tenant: str = "",
        resumed_tokens: int = 0,
        adapter: str = "",
    ) -> Request:
        """Prefill side of a handoff: compute the prompt and its first token, keep the cache until
        ``release_held``. ``params`` are the request's own (its seed and logprob settings apply);
        ``resumed_tokens`` and ``adapter`` as in ``add_request``."""
        first_only = dataclasses.replace(params, max_tokens=1, stop=(), stop_token_ids=())
        request = self._new_request(prompt_ids, first_only, request_id, tenant, adapter, resumed_tokens)
        request.hold_cache = True
        self.scheduler.add(request)
        return request

    def load_adapter(self, name: str, folder: str) -> LoraAdapter:
        """Load a PEFT LoRA folder as ``name``, usable by the next request (also while serving).

        Raises:
            AdapterError: a bad name or folder, or ``name`` already loaded; the message names the field.
        """
        return self.adapters.load(name, folder)

    def unload_adapter(self, name: str) -> None:
        """Unload ``name``; refused while a request uses it (``services.engine.adapters.registry``).

        Raises:
            UnknownAdapter: not loaded.
            AdapterInUse: unfinished (waiting, running or reserved) requests use it.
        """
        self.adapters.slot(name)
        users = sum(1 for r in self.scheduler.requests.values() if r.adapter == name)
        if users:
            raise AdapterInUse(
                f"adapter: {name!r} is used by {users} unfinished request(s); unload refused, retry when "
                "they finish"
            )
        self.adapters.remove(name)

    def abort(self, request_id: str) -> None:
        self.scheduler.abort(request_id)

    def step(self) -> list[Request]:
        """Run one step (drafting first, with a proposer); returns the requests that finished in it."""
        draftable = self.scheduler.draftable() if self.proposer is not None else []
        num_tokens = self._draft_length(draftable)
        started = self.clock()
        drafts = self.proposer.propose(draftable, num_tokens) if num_tokens else {}
        draft_seconds = self.clock() - started
        output = self.scheduler.schedule(drafts)
        if not output.chunks:
            return []
        started = self.clock()
        sampled = self.runner.execute(output, self.scheduler.requests)
        target_seconds = self.clock() - started
        if draftable:
            self._count_speculation(draftable, num_tokens, output, sampled, draft_seconds, target_seconds)
        return self.scheduler.update(output, sampled)

    def _draft_length(self, draftable: list[Request]) -> int:
        """Tokens to draft per request this step (0: none). The adaptive policy chooses, except in a
        step with a seeded sampled request: its tokens depend on how many drafts each verify had, and
        they must depend only on its seed, so such steps draft ``num_draft_tokens`` as the fixed
        policy does (greedy tokens never depend on it)."""
        if not draftable:
            return 0
        if self.spec_policy is None or any(_seeded_sampling(r) for r in draftable):
            return self.proposer.num_draft_tokens
        return self.spec_policy.choose(len(draftable))

    def _count_speculation(
        self,
        draftable: list[Request],
        num_tokens: int,
        output: SchedulerOutput,
        sampled: dict,
        draft_seconds: float,
        target_seconds: float,
    ) -> None:
        """Add a step with draftable requests to ``spec_counters`` and tell ``spec_policy`` what it cost
        (when every chunk was a decode or verify chunk: a prompt chunk's time would blur the two arms)."""
        counters = self.spec_counters
        counters.stepped(num_tokens)
        if num_tokens:
            counters.add_draft_seconds(draft_seconds)
        verifies = [
            (chunk.num_draft, sampled[chunk.request_id].num_accepted)
            for chunk in output.chunks
            if chunk.num_draft
        ]
        if verifies:
            counters.add_target_seconds(target_seconds)
        for num_drafted, num_accepted in verifies:
            counters.verified(num_drafted, num_accepted)
        if self.spec_policy is None:
            return
        self.spec_policy.observe_verifies(verifies)
        decoding = {request.request_id for request in draftable}
        if all(chunk.request_id in decoding for chunk in output.chunks) and not output.preempted:
            k = num_tokens if verifies else 0  # drafts all dropped by the scheduler: a plain step
            self.spec_policy.observe_step(len(draftable), k, target_seconds, draft_seconds if k else 0.0)

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished

    def close(self) -> None:
        """Stop the follower ranks, if any (idempotent); a one-rank engine holds nothing to stop."""
        if self.ranks is not None:
            self.ranks.close()

    def check_integrity(self) -> None:
        """Pools consistent (and the proposer's), every request's state and checkpoint slots accounted
        for, and with no request in flight, nothing held."""
        self.cache.check_integrity()
        self.scheduler.check_integrity()
        if self.proposer is not None:
            self.proposer.check_integrity()
        if not self.has_unfinished:
            assert self.cache.blocks.num_free == self.cache.blocks.num_blocks, "blocks leaked"
            assert self.cache.slots.num_free == self.cache.slots.num_slots, "state slots leaked"


def _seeded_sampling(request: Request) -> bool:
    return request.params.seed is not None and not request.params.greedy
