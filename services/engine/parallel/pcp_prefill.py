"""One prefill step over the PCP ranks of a stage: each rank computes its zigzag pieces.

Every rank of the PCP group calls ``pcp_forward_step`` with the same undivided step. A rank embeds and
runs the token-local work (projections, norms, MoE) on its own rows only; MLA layers gather the
group's latents into every rank's pool (``pcp_cache``) and attend the rank's queries to all earlier
keys; KDA layers pass state across ranks (``pcp_kda``). The wanted logits are gathered to every rank.

Each rank keeps a full copy of the step's cache (MLA rows and KDA slots), equal to a single rank's, so
decode or the handoff continues from any of them. At degree 1 this is ``CausalLM.forward_step``.
"""

import dataclasses

import torch

from services.engine.model.causal_lm import CausalLM
from services.engine.model.layer_cache import ModelCache
from services.engine.model.step_metadata import SequenceStep, build_step_metadata

from .context import ParallelContext
from .pcp_cache import PcpModelCache, RowExchange
from .pcp_kda import PcpKda
from .pcp_rows import gather_rows
from .stage_forward import embed, final_logits, run_layers
from .zigzag import zigzag_plan


def pcp_forward_step(
    model: CausalLM,
    steps: list[SequenceStep],
    block_size: int,
    cache: ModelCache,
    parallel: ParallelContext,
    logit_rows: list[int] | None = None,
) -> torch.Tensor:
    """Run one step's new tokens split over the PCP group, writing every token into ``cache``.

    Args:
        model: this rank's model (every layer; under PP use the stage's own driver).
        steps: the undivided step (the same on every PCP rank).
        block_size: tokens per block of ``cache``.
        cache: this rank's cache (its block tables and slots are the steps').
        parallel: this rank's context (``pcp_group``).
        logit_rows: rows of the undivided step whose logits are wanted (default: each sequence's last).

    Returns:
        ``[R, vocab]`` logits of ``logit_rows`` on every PCP rank.

    Raises:
        ValueError: a step with a LoRA adapter (not supported under PCP).
    """
    device = model.lm_head.weight.device
    if parallel.pcp_group is None:
        meta = build_step_metadata(steps, block_size, device, logit_rows, model.index_topk)
        return model.forward_step(meta, cache)
    if any(step.adapter for step in steps):
        raise ValueError("--pcp: prefill context parallelism does not run LoRA adapters yet; use --pcp 1")
    plan = zigzag_plan(steps, parallel.layout.pcp)
    rank, group = parallel.coordinates.pcp, parallel.pcp_group
    undivided = build_step_metadata(steps, block_size, device, index_topk=model.index_topk)
    if logit_rows is None:
        logit_rows = [end - 1 for end in undivided.query_start_loc_host[1:]]
    exchange = RowExchange(plan, rank, group, undivided.slot_mapping)
    local_cache = PcpModelCache(cache, exchange)
    ops = dataclasses.replace(model.kernels, kda=PcpKda(model.numerics, plan, rank, group))
    mine = plan.global_rows[rank]
    wanted = set(logit_rows)
    if mine:
        local_wanted = [i for i, row in enumerate(mine) if row in wanted]
        meta = build_step_metadata(plan.local_steps(rank), block_size, device, local_wanted, model.index_topk)
        hidden = run_layers(model, embed(model, meta), meta, local_cache, range(len(model.model.layers)), ops)
        logits = final_logits(model, hidden[meta.logit_rows])
    else:
        _join_exchanges(model, local_cache, ops)
        logits = final_logits(model, model.lm_head.weight.new_zeros(0, model.config.hidden_size))
    held = [[row for row in rows if row in wanted] for rows in plan.global_rows]
    return gather_rows(logits, held, logit_rows, group)


def _join_exchanges(model: CausalLM, cache: PcpModelCache, ops) -> None:
    """A rank holding no row of the step still joins every layer's exchange, with no rows of its own."""
    config, weight = model.config, model.lm_head.weight

    def nothing(*shape, dtype=weight.dtype):
        return torch.zeros(0, *shape, dtype=dtype, device=weight.device)

    for index, layer in enumerate(model.model.layers):
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
