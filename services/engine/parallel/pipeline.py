"""Pipeline parallelism for prefill: the layers split into ``pp`` contiguous stages, micro-batches of
chunks flowing stage to stage.

A stage holds only its layers' weights and caches: the loader builds a stage's model without the
other stages' modules (``keep_stage`` on the meta model) and skips their tensors
(``held_by_other_stage``); the pools take ``cache.layout.stage_layout``.
A prefill is a list of micro-batches (each a step: the next chunk of every prompt still going); stage
``s`` runs micro-batch ``m``, hands its hidden states to stage ``s + 1`` (a non-blocking send) and
starts ``m + 1`` at once, so the stages overlap::

    time ->      t0     t1     t2     t3
    stage 0      m0     m1     m2
    stage 1             m0     m1     m2

The last stage computes the logits. The layers, numerics and shapes a token goes through are those
of one process, so a pipeline's logits and caches are bitwise those of ``pp = 1``. Under PCP the
stage's PCP ranks split each micro-batch (``pcp_prefill.prepare_step``): PP stages x PCP ranks.
"""

import re
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from services.engine.model.causal_lm import CausalLM
from services.engine.model.layer_cache import ModelCache
from services.engine.model.step_metadata import SequenceStep

from .context import ParallelContext
from .pcp_prefill import LocalStep, PcpStep, prepare_step


def stage_layers(num_layers: int, pp: int, stage: int) -> range:
    """The layers of ``stage``: contiguous, the first ``num_layers % pp`` stages one layer more.

    Raises:
        ValueError: ``pp`` above ``num_layers`` (naming ``--pp``), or ``stage`` outside ``[0, pp)``.
    """
    if pp > num_layers:
        raise ValueError(
            f"--pp {pp}: more pipeline stages than the model's {num_layers} layers; use --pp <= {num_layers}"
        )
    if not 0 <= stage < pp:
        raise ValueError(f"stage {stage} is outside [0, {pp})")
    base, extra = divmod(num_layers, pp)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (stage < extra))


class _Absent(nn.Module):
    """Stands where another stage's layer (or the embedding / head) would be: no weights."""

    def forward(self, *args):
        raise RuntimeError("this module lives on another pipeline stage")


def stage_position(parallel: ParallelContext, num_layers: int) -> tuple[range, bool, bool]:
    """``(layers, first, last)`` of the rank's pipeline stage."""
    pp, stage = parallel.layout.pp, parallel.coordinates.pp
    return stage_layers(num_layers, pp, stage), stage == 0, stage == pp - 1


def keep_stage(model: CausalLM, layers: range, first: bool, last: bool) -> None:
    """Drop every module ``model`` does not need as the stage running ``layers`` (on the meta device
    before its weights are allocated, or after loading).

    The embedding stays on the first stage (and on the last when the LM head is tied to it), the final
    norm and LM head on the last. A stage's model runs through ``stage_forward`` / ``PipelineStage``;
    its ``forward_step`` is the whole model's and needs every stage.
    """
    for index in range(len(model.model.layers)):
        if index not in layers:
            model.model.layers[index] = _Absent()
    if not first and not (last and model.config.tie_word_embeddings):
        model.model.embed_tokens = _Absent()
    if not last:
        model.model.norm = _Absent()
        model.lm_head = _Absent()


_LAYER_TENSOR = re.compile(r"model\.layers\.(\d+)\.")


def held_by_other_stage(name: str, parallel: ParallelContext, num_layers: int, tied: bool) -> bool:
    """Whether checkpoint tensor ``name`` belongs to a module another pipeline stage holds (the loader
    skips it). A layer index past the model's layers is not claimed: the loader judges it."""
    if parallel.layout.pp == 1:
        return False
    layers, first, last = stage_position(parallel, num_layers)
    if match := _LAYER_TENSOR.match(name):
        index = int(match.group(1))
        return index < num_layers and index not in layers
    if name.startswith("model.embed_tokens."):
        return not first and not (last and tied)
    if name.startswith(("model.norm.", "lm_head.")):
        return not last
    return False


@dataclass(frozen=True)
class PipelineStage:
    """One rank's stage: its model (pruned or not), layers and neighbours.

    Attributes:
        model: the stage's model.
        parallel: the rank's context (``pp_group``: the ranks of this position in every stage).
        layers: the stage's layers.
    """

    model: CausalLM
    parallel: ParallelContext
    layers: range

    @staticmethod
    def build(model: CausalLM, parallel: ParallelContext) -> "PipelineStage":
        """The stage of ``parallel.coordinates.pp`` (``load_model(..., parallel)`` already left out the
        other stages' modules; a whole model is cut down here)."""
        layers, first, last = stage_position(parallel, len(model.model.layers))
        keep_stage(model, layers, first, last)
        return PipelineStage(model, parallel, layers)

    @property
    def stage(self) -> int:
        return self.parallel.coordinates.pp

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.parallel.layout.pp - 1

    def prefill(
        self, micro_batches: list[list[SequenceStep]], block_size: int, cache: ModelCache
    ) -> list[torch.Tensor]:
        """Run every micro-batch through this stage, in order (every stage calls it with the same list).

        Under PCP each micro-batch is split over the stage's PCP ranks (``pcp_prefill``), and PCP rank
        ``r`` hands its rows to PCP rank ``r`` of the next stage (a rank holding none sends nothing).

        Args:
            micro_batches: the steps, in the order their tokens must enter the cache.
            block_size: tokens a block id covers (under DCP the virtual ``dcp * B``).
            cache: the stage's cache (at least its layers' fields).

        Returns:
            On the last stage, each micro-batch's ``[S, vocab]`` logits of its sequences' last rows;
            an empty list elsewhere.
        """
        logits, sends = [], []
        for steps in micro_batches:
            part = prepare_step(self.model, steps, block_size, cache, self.parallel)
            hidden = self._receive_and_run(part)
            if self.is_last:
                logits.append(part.logits(hidden))
            elif part.num_rows:  # the send runs while this stage starts the next micro-batch
                # the tensor is kept until its send is waited on
                sends.append((dist.isend(hidden, self._neighbour(1), group=self.parallel.pp_group), hidden))
        for work, _ in sends:
            work.wait()
        return logits

    def step(
        self, steps: list[SequenceStep], block_size: int, cache: ModelCache, logit_rows: list[int]
    ) -> torch.Tensor | None:
        """Run one engine step through this stage and hand its rows on before returning (every stage
        calls it with the same step; under PCP split as in ``prefill``).

        Args:
            steps: the step.
            block_size: tokens a block id covers (under DCP the virtual ``dcp * B``).
            cache: the stage's cache.
            logit_rows: rows of the step whose logits are wanted.

        Returns:
            On the last stage the ``[len(logit_rows), vocab]`` logits; None elsewhere.
        """
        part = prepare_step(self.model, steps, block_size, cache, self.parallel, logit_rows)
        hidden = self._receive_and_run(part)
        if self.is_last:
            return part.logits(hidden)
        if part.num_rows:
            dist.send(hidden, self._neighbour(1), group=self.parallel.pp_group)
        return None

    def _neighbour(self, offset: int) -> int:
        """The global rank of the stage ``offset`` stages on, at this rank's place in its stage."""
        return dist.get_process_group_ranks(self.parallel.pp_group)[self.stage + offset]

    def _receive_and_run(self, part: LocalStep | PcpStep) -> torch.Tensor:
        """This stage's layers over the part's rows: embedded on the first stage, else received from
        the stage before."""
        if self.is_first:
            hidden = part.embed()
        else:
            # the residual stream's dtype and device: those of the stage's first layer's norm
            norm = self.model.model.layers[self.layers.start].input_layernorm.weight
            hidden = norm.new_empty(part.num_rows, self.model.config.hidden_size)
            if part.num_rows:
                dist.recv(hidden, self._neighbour(-1), group=self.parallel.pp_group)
        return part.run_layers(hidden, self.layers)


def chunk_micro_batches(
    prompts: list[list[int]], chunk: int, block_tables: list[tuple[int, ...]], slots: list[int]
) -> list[list[SequenceStep]]:
    """Prompts cut into micro-batches: micro-batch ``m`` is chunk ``m`` (``chunk`` tokens) of every
    prompt still going, each continuing its sequence's cache (block table, KDA slot)."""
    if chunk < 1:
        raise ValueError(f"chunk: must be >= 1, got {chunk}")
    longest = max(len(p) for p in prompts)
    batches = []
    for start in range(0, longest, chunk):
        batches.append(
            [
                SequenceStep(tuple(p[start : start + chunk]), start, block_tables[s], slots[s])
                for s, p in enumerate(prompts)
                if len(p) > start
            ]
        )
    return batches
