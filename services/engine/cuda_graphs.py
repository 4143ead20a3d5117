"""CUDA graphs for pure-decode steps: one graph per captured batch size, the step padded up to it.

Each graph owns static buffers: the step's packed metadata (``StepMetadata.packed``), and, when the
sampling backend can be captured, the sampling parameters. A replay copies the new step into them
(one host-to-device copy each) and launches the whole forward (+ sampling) at once. Padding rows are
sequences of one token at position 0 in the pools' scratch block and scratch slot, so they never
touch a real request's cache. Prefill and mixed steps run eagerly.

The target's graphs sample inside the graph (``replay``); the draft model's capture the forward only
(``sample=False``) and read the logits rows (``replay_logits``), which it samples itself.

Verify graphs (``num_draft = k > 0``, ``--kda-rollback states``) capture speculative decoding's verify
step: every sequence brings ``1 + k`` tokens (its last token and ``k`` drafts, each draft with its KDA
state slot: ``SequenceStep.draft_slots``) and every row gives logits, which the runner verifies. Their
padding sequences are ``1 + k`` tokens at positions ``0 .. k`` in the scratch block, without drafts.
"""

import logging
from dataclasses import dataclass

import torch

from common.sampling_params import MAX_LOGPROBS, SamplingParams
from services.engine.cache.paged_cache import PagedModelCache
from services.engine.engine_config import EngineConfig
from services.engine.model.backends.sampling import SamplingInputs, TritonSampling
from services.engine.model.causal_lm import CausalLM
from services.engine.model.step_metadata import SequenceStep, StepMetadata, build_step_metadata
from services.engine.sampling import SampleOutput

log = logging.getLogger(__name__)

_GREEDY = SamplingParams(temperature=0.0)


def use_cuda_graphs(config: EngineConfig, model: CausalLM, parallel: bool) -> bool:
    """Whether an engine replays decode CUDA graphs: ``config.cuda_graphs`` on, a CUDA device, one rank
    (``parallel`` False) and a ``model`` whose forward can be captured; why not is logged. The engine
    decides once for its target; its draft model follows that decision (``DraftModelProposer``)."""
    if not config.cuda_graphs:
        return False
    if parallel:
        log.info("--cuda-graphs: off on a parallel engine for now (steps run eagerly on every rank)")
        return False
    if not config.device.startswith("cuda"):
        log.info("--cuda-graphs: a no-op on the CPU (steps run eagerly)")
        return False
    return forward_capturable(model, "the model")


def forward_capturable(model: CausalLM, name: str) -> bool:
    """Whether ``model``'s kernel set is ``forward_graph_safe``; if not, logs which families of
    ``name`` (for the log line) run reference kernels."""
    if model.kernels.forward_graph_safe:
        return True
    reference = model.kernels.reference_families()
    log.info(
        "--cuda-graphs: off for %s, %s run their reference kernels (host loops cannot be captured)",
        name,
        ", ".join(f for f in reference if f != "sampling"),
    )
    return False


def capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """1, 2, 4, 8, then every multiple of 16, up to and including ``max_num_seqs``."""
    sizes = {size for size in (1, 2, 4, 8) if size <= max_num_seqs}
    sizes.update(range(16, max_num_seqs + 1, 16))
    sizes.add(max_num_seqs)
    return tuple(sorted(sizes))


@dataclass
class _Graph:
    """One captured size: its graph, static inputs and static outputs."""

    size: int
    meta: StepMetadata
    sampling: SamplingInputs | None
    graph: torch.cuda.CUDAGraph | None = None
    logits: torch.Tensor | None = None
    sampled: tuple[torch.Tensor, ...] | None = None


class DecodeGraphs:
    """Captured decode steps for one model and cache.

    Args:
        model: the model (its kernel set must be ``forward_graph_safe``).
        cache: the paged cache (pools built with ``scratch=True``).
        sizes: batch sizes to capture (``capture_sizes``).
        max_seq_len: the longest sequence a replayed step may hold (the engine's ``max_model_len``);
            kernels see it as their bound.
        sample: capture the sampling too when the sampling backend can be captured (the target's
            ``replay``); False captures the forward only (the draft model's ``replay_logits``).
        num_draft: 0 for decode steps; ``k`` captures verify steps of ``1 + k`` tokens per sequence
            (forward only: ``replay_logits``, every row's logits).
    """

    def __init__(
        self,
        model: CausalLM,
        cache: PagedModelCache,
        sizes: tuple[int, ...],
        max_seq_len: int,
        sample: bool = True,
        num_draft: int = 0,
    ):
        if not model.kernels.forward_graph_safe:
            raise ValueError(
                "cuda_graphs: the forward has host loops in "
                f"{', '.join(model.kernels.reference_families())} (reference kernels); it cannot be captured"
            )
        if cache.blocks.scratch_id is None or cache.slots.scratch_id is None:
            raise ValueError("cuda_graphs: the pools need a scratch block and slot (scratch=True)")
        self.model, self.cache, self.max_seq_len = model, cache, max_seq_len
        self.num_draft = num_draft
        self.max_blocks = -(-max_seq_len // cache.block_size)
        capturable = isinstance(model.kernels.sampling, TritonSampling)
        self.sampler = model.kernels.sampling if sample and capturable and not num_draft else None
        self.device = cache.blocks.storage.device
        self.pool = torch.cuda.graph_pool_handle()
        pad_blocks = (cache.blocks.scratch_id,) * -(-self.query_len // cache.block_size)
        self.pad = SequenceStep((0,) * self.query_len, 0, pad_blocks, cache.slots.scratch_id)
        self.graphs = {size: self._static(size) for size in sizes}
        self.replays = 0  # steps served from a graph (benchmarks and tests read it)

    @property
    def query_len(self) -> int:
        """Tokens of each sequence in a captured step: ``1 + num_draft``."""
        return 1 + self.num_draft

    @property
    def max_size(self) -> int:
        return max(self.graphs)

    def _static(self, size: int) -> _Graph:
        meta = self._metadata([self.pad] * size, None)
        sampling = None
        if self.sampler is not None:
            sampling = self.sampler.inputs([_GREEDY] * size, [0] * size, self.device, MAX_LOGPROBS)
        return _Graph(size, meta, sampling)

    def _metadata(self, steps: list[SequenceStep], out: torch.Tensor | None) -> StepMetadata:
        return build_step_metadata(
            steps,
            self.cache.block_size,
            self.device,
            logit_rows=list(range(len(steps) * self.query_len)),
            index_topk=self.model.index_topk,
            max_blocks=self.max_blocks,
            max_seq_len=self.max_seq_len,
            out=out,
            token_slots=bool(self.num_draft),
        )

    def _run(self, graph: _Graph) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        logits = self.model.forward_step(graph.meta, self.cache)
        sampled = None if self.sampler is None else self.sampler.sample_device(logits, graph.sampling)
        return logits, sampled

    @torch.no_grad()
    def capture(self) -> None:
        """Warm every size up eagerly (kernels compile), then capture, largest first (shared pool)."""
        for size in sorted(self.graphs, reverse=True):
            graph = self.graphs[size]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._run(graph)
            torch.cuda.current_stream().wait_stream(side)
            graph.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph.graph, pool=self.pool):
                graph.logits, graph.sampled = self._run(graph)
        torch.cuda.synchronize()
        log.info("captured decode CUDA graphs for batch sizes %s", sorted(self.graphs))

    def can_replay(self, steps: list[SequenceStep], num_sampling: int) -> bool:
        """A step these graphs hold: a pure-decode step (one token after a prefix, every sequence
        sampling: ``num_sampling`` of the ``steps`` give a logits row), or for verify graphs a step of
        ``1 + k`` tokens per sequence after a prefix, ``k`` of them drafts with their slots, every row a
        logits row; and it fits a graph. The same test for ``replay`` and ``replay_logits``."""
        return (
            len(steps) <= self.max_size
            and num_sampling == len(steps) * self.query_len
            and all(len(step.token_ids) == self.query_len and step.past > 0 for step in steps)
            and all(len(step.draft_slots) == step.num_draft == self.num_draft for step in steps)
            and all(step.past + self.query_len <= self.max_seq_len for step in steps)
        )

    def replay_logits(self, steps: list[SequenceStep], input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Run a step from its graph (check ``can_replay(steps, len(steps) * query_len)`` first) without
        sampling.

        Returns:
            ``[len(steps) * query_len, vocab]``: every row's logits in step order, a view of the graph's
            static logits (no copy): the next replay at the same padded size overwrites it, so the caller
            copies or consumes it first (on the current stream, which replays run on).

        ``input_ids``: ``[len(steps) * query_len]`` device token ids that replace the steps' own (a
        draft's argmax fed on without a host sync; the steps then carry placeholders).
        """
        graph = self.graphs[self.padded_size(len(steps))]
        self._metadata(list(steps) + [self.pad] * (graph.size - len(steps)), graph.meta.packed)
        if input_ids is not None:
            graph.meta.input_ids[: input_ids.shape[0]].copy_(input_ids)
        graph.graph.replay()
        self.replays += 1
        return graph.logits[: len(steps) * self.query_len]

    def padded_size(self, batch: int) -> int:
        """The captured size a batch of ``batch`` sequences replays at."""
        return min(size for size in self.graphs if size >= batch)

    def replay(
        self, steps: list[SequenceStep], params: list[SamplingParams], positions: list[int]
    ) -> SampleOutput:
        """Run a decode step from its graph (check ``can_replay`` first) and sample its rows (decode
        graphs only)."""
        graph = self.graphs[self.padded_size(len(steps))]
        padding = graph.size - len(steps)
        self._metadata(list(steps) + [self.pad] * padding, graph.meta.packed)
        if self.sampler is not None:
            self.sampler.inputs(
                list(params) + [_GREEDY] * padding,
                list(positions) + [0] * padding,
                self.device,
                MAX_LOGPROBS,
                out=graph.sampling.packed,
            )
        graph.graph.replay()
        self.replays += 1
        if self.sampler is not None:
            return self.sampler.to_output(graph.sampled, params)
        return self.model.kernels.sampling.sample(graph.logits[: len(steps)], params, positions)

    def logits(self, batch: int) -> torch.Tensor:
        """The static logits the last replay at ``batch``'s size wrote (rows past ``batch`` are padding)."""
        return self.graphs[self.padded_size(batch)].logits
