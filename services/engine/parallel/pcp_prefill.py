"""One prefill step over the PCP ranks of a stage: each rank computes its zigzag pieces.

Every rank of the PCP group prepares the same undivided step (``prepare_step``). A rank embeds and
runs the token-local work (projections, norms, MoE) on its own rows only; MLA layers gather the
group's latents into every rank's pool (``pcp_cache``) and attend the rank's queries to all earlier
keys; KDA layers pass state across ranks (``pcp_kda``). The wanted logits are gathered to every rank.

Each rank keeps a full copy of the step's cache (MLA rows and KDA slots), equal to a single rank's, so
decode or the handoff continues from any of them. Under DCP too, "full" is the DCP rank's shard of the
MLA rows: every DCP rank of a PCP rank computes the same pieces, writes the rows its DCP rank owns,
attends them as DCP attention (LSE merge over the DCP group) and selects DSA keys by the distributed
top-k; KDA is not split by DCP. Under PP each stage's PCP ranks run the stage's
layers (``PipelineStage``): PCP rank ``r`` of a stage hands its rows to PCP rank ``r`` of the next.
"""

import dataclasses
from dataclasses import dataclass

import torch

from services.engine.model.backends import KernelSet
from services.engine.model.causal_lm import CausalLM
from services.engine.model.layer_cache import ModelCache
from services.engine.model.step_metadata import SequenceStep, StepMetadata, build_step_metadata

from .context import ParallelContext
from .dcp_attention import DcpAttention
from .pcp_cache import GatheredDcpAttention, PcpModelCache, RowExchange
from .pcp_kda import PcpKda
from .pcp_rows import gather_rows
from .stage_forward import embed, final_logits, run_layers
from .zigzag import ZigzagPlan, zigzag_plan


@dataclass(frozen=True)
class LocalStep:
    """A step run whole by this rank (no PCP group): ``CausalLM.forward_step`` in parts."""

    model: CausalLM
    meta: StepMetadata
    cache: ModelCache

    @property
    def num_rows(self) -> int:
        return self.meta.num_tokens

    def embed(self) -> torch.Tensor:
        return embed(self.model, self.meta)

    def run_layers(self, hidden: torch.Tensor, layers: range) -> torch.Tensor:
        return run_layers(self.model, hidden, self.meta, self.cache, layers)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return final_logits(self.model, hidden[self.meta.logit_rows])


@dataclass(frozen=True)
class PcpStep:
    """This PCP rank's part of a step: its pieces' metadata (None when it holds no row), the cache
    with gathered MLA writes, the kernel set with ``PcpKda`` (under DCP also ``GatheredDcpAttention``),
    and which rows' logits each rank holds."""

    model: CausalLM
    plan: ZigzagPlan
    rank: int
    parallel: ParallelContext
    meta: StepMetadata | None
    cache: PcpModelCache
    ops: KernelSet
    logit_rows: tuple[int, ...]

    @property
    def num_rows(self) -> int:
        return len(self.plan.global_rows[self.rank])

    def embed(self) -> torch.Tensor:
        if self.meta is None:
            weight = self.model.model.embed_tokens.weight
            return weight.new_zeros(0, weight.shape[1])
        return embed(self.model, self.meta)

    def run_layers(self, hidden: torch.Tensor, layers: range) -> torch.Tensor:
        if self.meta is None:
            _join_exchanges(self.model, self.cache, self.ops, layers)
            return hidden
        return run_layers(self.model, hidden, self.meta, self.cache, layers, self.ops)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[R, vocab]`` logits of the step's ``logit_rows``, gathered to every PCP rank."""
        local = hidden[self.meta.logit_rows] if self.meta is not None else hidden
        logits = final_logits(self.model, local)
        wanted = set(self.logit_rows)
        held = [[row for row in rows if row in wanted] for rows in self.plan.global_rows]
        return gather_rows(logits, held, list(self.logit_rows), self.parallel.pcp_group)


def prepare_step(
    model: CausalLM,
    steps: list[SequenceStep],
    block_size: int,
    cache: ModelCache,
    parallel: ParallelContext,
    logit_rows: list[int] | None = None,
) -> LocalStep | PcpStep:
    """This rank's part of a step: a ``PcpStep`` under a PCP group, else the ``LocalStep``.

    Args:
        model: this rank's model.
        steps: the undivided step (the same on every PCP rank).
        block_size: tokens a block id covers (under DCP the virtual ``dcp * B``, else ``cache``'s ``B``).
        cache: this rank's cache (its block tables and slots are the steps').
        parallel: this rank's context (``pcp_group``).
        logit_rows: rows of the undivided step whose logits are wanted (default: each sequence's last).

    Raises:
        ValueError: a step with a LoRA adapter (the parts run without adapters).
    """
    if any(step.adapter for step in steps):
        raise ValueError(
            "--pcp / --pp: prefill split over ranks does not run LoRA adapters yet; use --pcp 1 --pp 1"
        )
    device = next(model.parameters()).device  # a pipeline stage holds only some modules
    if parallel.pcp_group is None:
        meta = build_step_metadata(steps, block_size, device, logit_rows, model.index_topk)
        return LocalStep(model, meta, cache)
    plan = zigzag_plan(steps, parallel.layout.pcp)
    rank, group = parallel.coordinates.pcp, parallel.pcp_group
    undivided = build_step_metadata(steps, block_size, device, index_topk=model.index_topk)
    if logit_rows is None:
        logit_rows = [end - 1 for end in undivided.query_start_loc_host[1:]]
    ops = dataclasses.replace(model.kernels, kda=PcpKda(model.numerics, plan, rank, group))
    shard = None
    if isinstance(ops.attention, DcpAttention):  # under DCP: block_size is the virtual one
        shard = ops.attention.shard
        ops = dataclasses.replace(ops, attention=GatheredDcpAttention.of(ops.attention))
    exchange = RowExchange(plan, rank, group, undivided.slot_mapping, shard)
    meta = None
    if plan.global_rows[rank]:
        wanted = set(logit_rows)
        local_wanted = [i for i, row in enumerate(plan.global_rows[rank]) if row in wanted]
        meta = build_step_metadata(plan.local_steps(rank), block_size, device, local_wanted, model.index_topk)
    return PcpStep(model, plan, rank, parallel, meta, PcpModelCache(cache, exchange), ops, tuple(logit_rows))


def pcp_forward_step(
    model: CausalLM,
    steps: list[SequenceStep],
    block_size: int,
    cache: ModelCache,
    parallel: ParallelContext,
    logit_rows: list[int] | None = None,
) -> torch.Tensor:
    """Run one step's new tokens through every layer, split over the PCP group (``prepare_step``'s
    arguments), writing every token into ``cache``.

    Returns:
        ``[R, vocab]`` logits of ``logit_rows`` on every PCP rank.
    """
    if parallel.pcp_group is None:  # one rank: the model's own step (adapters included)
        device = next(model.parameters()).device
        return model.forward_step(
            build_step_metadata(steps, block_size, device, logit_rows, model.index_topk), cache
        )
    part = prepare_step(model, steps, block_size, cache, parallel, logit_rows)
    return part.logits(part.run_layers(part.embed(), range(len(model.model.layers))))


def _join_exchanges(model: CausalLM, cache: PcpModelCache, ops: KernelSet, layers: range) -> None:
    """A rank holding no row of the step still joins every layer's exchange, with no rows of its own."""
    config, weight = model.config, model.model.layers[layers.start].input_layernorm.weight

    def nothing(*shape, dtype=weight.dtype):
        return torch.zeros(0, *shape, dtype=dtype, device=weight.device)

    for index in layers:
        layer = model.model.layers[index]
        if layer.is_kda:
            attention = layer.self_attn  # under TP: this rank's heads
            heads, dim = attention.num_heads, attention.head_dim
            layer_cache = cache.kda(index)
            taps = attention.conv1d.weight.squeeze(1)
            ops.kda.short_conv(nothing(3 * attention.width), taps, layer_cache, None)
            empty = nothing(heads, dim)
            ops.kda.forward(empty, empty, empty, empty.float(), nothing(heads), 1.0, layer_cache, None)
        else:
            index_keys = None if config.indexer is None else nothing(config.indexer.head_dim)
            rope_keys = nothing(config.qk_rope_head_dim)
            cache.mla(index).write(None, nothing(config.kv_lora_rank), rope_keys, index_keys)
