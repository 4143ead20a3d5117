"""One rank's share of an MLA layer's decode attention under each decode layout, on one device.

What a decode layout changes in an MLA layer with a DSA indexer is who reads which part of the
context: TP splits the attention heads (every TP rank reads every cached row), DCP splits the tokens
(rank ``r`` holds positions ``p % dcp == r``) and then needs the exact distributed top-k and an LSE
merge. This benchmark runs, for a layout ``tp x dcp``, the work rank 0 does per MLA layer and step,
with the engine's own kernels and DCP pieces, at real shapes:

- ``index``: the indexer's scores over the rank's keys (``paged_indexer_scores``; every TP rank
  scores all index heads: the indexer is not split by TP);
- ``topk``: DCP 1: ``topk_by_score`` over all keys; DCP > 1: the rank's best ``c``
  (``best_candidates``), then the merge of every rank's candidates and the refill test
  (``merge_candidates``, ``needs_refill``) as ``distributed_topk`` runs them (a refill's second
  round, each rank's best ``k`` of the rows that need it, is counted, not timed);
- ``attend``: sparse absorbed MLA over the selected keys the rank holds, ``heads / tp`` heads
  (``paged_mla_decode`` with ``DcpShard.local_selection``);
- ``merge``: the LSE merge of every rank's ``(out, lse)``, DCP > 1 only: the engine's Triton kernel
  (``kernels.mla.lse_merge_triton``) and, in its own column, the reference loop it replaced.

Every rank of the DCP group is computed for real (its own pool of random rows, its own scores), so
the candidates merged and the partials combined are the ones the group would exchange; only the
collectives themselves are not run: on one device there is no NVLink to measure. The bytes each
rank would send per layer are exact (round 1 of the top-k, the refill rows it needed, the
``(out, lse)`` all-gather). Steps are timed as CUDA-graph replays (``timing.graph_us``).

Run: ``python -m services.engine.benchmark.layout_attention`` (docs/performance.md, "Eight-GPU layouts").
"""

import argparse
import itertools
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch

from kernels.dsa.paged_triton import paged_indexer_scores, topk_by_score
from kernels.dsa.topk_merge import best_candidates, merge_candidates, needs_refill
from kernels.fp8.naive import index_key_fp8_bytes, latent_fp8_bytes
from kernels.mla import lse_merge, lse_merge_triton
from kernels.mla.paged_triton import paged_mla_decode
from services.engine.checkpoint.presets import preset_config, with_layers
from services.engine.model.config import LAYER_MLA
from services.engine.model.config_loader import load_model_config
from services.engine.parallel.dcp_shard import DcpShard
from services.engine.parallel.distributed_topk import default_candidates

from .attention_kernels import AttentionShapes, PagedDecodeStep
from .timing import graph_us

GIB = 1 << 30


@dataclass(frozen=True)
class LayoutRow:
    """Rank 0's per-layer work under one layout, context and batch (times in microseconds)."""

    tp: int
    dcp: int
    context: int
    batch: int
    kv_bytes_per_rank: int  # the rank's cached MLA rows and index keys of the batch, one layer
    index_us: float
    topk_us: float
    attend_us: float
    merge_us: float
    loop_merge_us: float  # the reference loop's merge (``kernels.mla.lse_merge``), for comparison
    best_k_topk_us: float  # the top-k when each rank ranks its best k first (before: c of those sent)
    candidates: int  # what each rank sends in round 1 (k at DCP 1: nothing is sent)
    refilled_rows: int  # rows of the batch that needed the second top-k round
    sent_bytes: int  # per rank and layer: top-k rounds + the (out, lse) all-gather

    @property
    def total_us(self) -> float:
        return self.index_us + self.topk_us + self.attend_us + self.merge_us


def _rank_steps(shapes, kv_format, tp, dcp, context, batch, device):
    """Every DCP rank's pool (``context / dcp`` tokens per sequence) and queries, ``heads / tp`` heads."""
    rank_shapes = replace(shapes, heads=shapes.heads // tp)
    local = -(-context // dcp)
    return rank_shapes, [PagedDecodeStep(rank_shapes, kv_format, local, batch, device) for _ in range(dcp)]


def measure(
    shapes: AttentionShapes,
    kv_format: str,
    tp: int,
    dcp: int,
    context: int,
    batch: int,
    device: str,
    timer: Callable[[Callable[[], object]], float] = graph_us,
) -> LayoutRow:
    """Rank 0's per-layer times under ``tp x dcp`` for ``batch`` sequences of ``context`` tokens.

    Checks on the way that the group's merged selection is the single-rank top-k of all its scores
    (``AssertionError`` otherwise). ``timer`` times one call of a piece of work in microseconds.
    """
    rank_shapes, steps = _rank_steps(shapes, kv_format, tp, dcp, context, batch, device)
    shards = [DcpShard(rank, dcp) for rank in range(dcp)]
    gen = torch.Generator(device=device).manual_seed(0)
    h, dc, dr = rank_shapes.heads, shapes.kv_lora_rank, shapes.rope_dim
    q_latent = (torch.randn(batch, h, dc, device=device, generator=gen) * 0.05).to(torch.bfloat16)
    q_rope = (torch.randn(batch, h, dr, device=device, generator=gen) * 0.05).to(torch.bfloat16)
    q_index = torch.randn(batch, shapes.index_heads, shapes.index_dim, device=device, generator=gen)
    q_index = q_index.to(torch.bfloat16)
    weights = torch.randn(batch, shapes.index_heads, device=device, generator=gen) * shapes.index_heads**-0.5
    last = torch.full((batch,), context - 1, dtype=torch.int64, device=device)
    index_scale, attend_scale, k = shapes.index_dim**-0.5, (shapes.nope_dim + dr) ** -0.5, shapes.topk
    width = max(shards[0].local_bound(context), k)

    def scores_of(rank: int) -> torch.Tensor:
        step = steps[rank]
        query_pos = shards[rank].last_local_position(last)
        return paged_indexer_scores(
            q_index, weights, step.pool.index_key, step.tables, step.query_seq, query_pos, index_scale, width
        )

    def attend(rank: int, selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        step = steps[rank]
        return paged_mla_decode(
            q_latent, q_rope, step.pool.latent, step.pool.rope, step.tables, step.query_seq,
            shards[rank].last_local_position(last), shards[rank].local_selection(selected), attend_scale,
            shards[rank].local_bound(context),
        )  # fmt: skip

    local = torch.arange(width, device=device)
    positions = [shards[rank].global_positions(local).expand(batch, -1) for rank in range(dcp)]
    scores = [scores_of(rank) for rank in range(dcp)]
    sent = default_candidates(k, dcp) if dcp > 1 else k
    best = [best_candidates(rank_scores, positions[rank], sent) for rank, rank_scores in enumerate(scores)]
    held = torch.stack([(rank_scores > float("-inf")).sum(dim=-1) for rank_scores in scores])
    sent_scores, sent_positions = torch.stack([s for s, _ in best]), torch.stack([p for _, p in best])
    _, selected = merge_candidates(sent_scores, sent_positions, k)
    refill = needs_refill(sent_positions, held, selected)
    refilled = int(refill.sum()) if dcp > 1 else 0
    if refilled:  # the second round: every rank's best k of the rows that need it
        rows = refill.nonzero().flatten()
        again = [best_candidates(s[rows], positions[rank][rows], k) for rank, s in enumerate(scores)]
        selected[rows] = merge_candidates(
            torch.stack([s for s, _ in again]), torch.stack([p for _, p in again]), k
        )[1]
    everything = torch.stack(scores, dim=-1).reshape(batch, -1)  # column l * dcp + r: global position
    assert torch.equal(selected, topk_by_score(everything, k)), "the merged top-k is not the single-rank one"
    del everything, scores

    partials = [attend(rank, selected) for rank in range(dcp)]
    outs = torch.stack([out for out, _ in partials])
    lses = torch.stack([lse for _, lse in partials])
    scores0 = scores_of(0)
    index_us = timer(lambda: scores_of(0))
    merge_us = loop_merge_us = best_k_topk_us = 0.0
    if dcp == 1:
        topk_us = timer(lambda: topk_by_score(scores0, k))
    else:
        merged = lse_merge_triton.merge_by_lse(outs, lses)
        reference = lse_merge.merge_by_lse(outs, lses)
        assert torch.allclose(merged[0].float(), reference[0].float(), rtol=1e-2, atol=1e-3), "merge"
        exchange_us = timer(
            lambda: needs_refill(sent_positions, held, merge_candidates(sent_scores, sent_positions, k)[1])
        )
        topk_us = timer(lambda: best_candidates(scores0, positions[0], sent)) + exchange_us
        best_k_topk_us = timer(lambda: best_candidates(scores0, positions[0], k)) + exchange_us
        merge_us = timer(lambda: lse_merge_triton.merge_by_lse(outs, lses))
        loop_merge_us = timer(lambda: lse_merge.merge_by_lse(outs, lses))
    attend_us = timer(lambda: attend(0, selected))
    exchange = 0
    if dcp > 1:  # round 1's candidates, the refill rows' second round, the (out, lse) all-gather
        exchange = batch * (2 * sent + 1) * 4 + refilled * (2 * k + 1) * 4 + batch * h * (dc * 2 + 4)
    pool = steps[0].pool
    kv_bytes = batch * -(-context // dcp) * (pool.row_bytes + pool.index_row_bytes)
    return LayoutRow(
        tp,
        dcp,
        context,
        batch,
        kv_bytes,
        index_us,
        topk_us,
        attend_us,
        merge_us,
        loop_merge_us,
        best_k_topk_us,
        sent,
        refilled,
        exchange,
    )


def _fits(shapes: AttentionShapes, kv_format: str, context: int, batch: int, budget_bytes: int) -> bool:
    """Whether every rank's pool of the group (the whole context, ``batch`` sequences) fits ``budget``."""
    if kv_format == "bf16":
        row = (shapes.kv_lora_rank + shapes.rope_dim + shapes.index_dim) * 2
    else:
        row = latent_fp8_bytes(shapes.kv_lora_rank, shapes.rope_dim) + index_key_fp8_bytes(shapes.index_dim)
    scores = batch * context * (4 + 8 + 8)  # float32 scores, int64 order keys and positions
    return batch * context * row + scores <= budget_bytes


def _table(rows: list[LayoutRow], mla_layers: int) -> str:
    """The rows as a markdown table; ``vs TP1`` is the layer time over TP1xDCP1's at the same cell, and
    the two ``before`` columns are what the top-k and the merge cost before (best k first, the loop)."""
    lines = [
        "| layout | context | batch | KV per rank (GiB, 1 layer) | index µs | top-k µs (before) "
        "| attend µs | merge µs (before) "
        f"| layer µs | x{mla_layers} MLA layers (ms) | vs TP1 | sent per rank (KiB) | refilled rows |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = {(r.context, r.batch): r.total_us for r in rows if r.tp == 1 and r.dcp == 1}
    for r in rows:
        ratio = base.get((r.context, r.batch))
        topk = f"{r.topk_us:.1f}" + (f" ({r.best_k_topk_us:.1f})" if r.dcp > 1 else "")
        merge = f"{r.merge_us:.1f} ({r.loop_merge_us:.1f})" if r.dcp > 1 else "-"
        lines.append(
            f"| TP{r.tp}xDCP{r.dcp} | {r.context // 1024}K | {r.batch} | {r.kv_bytes_per_rank / GIB:.2f} "
            f"| {r.index_us:.1f} | {topk} | {r.attend_us:.1f} | {merge} | {r.total_us:.1f} "
            f"| {r.total_us * mla_layers / 1e3:.2f} | {f'{r.total_us / ratio:.2f}' if ratio else '-'} "
            f"| {r.sent_bytes / 1024:.1f} | {r.refilled_rows} |"
        )
    return "\n".join(lines)


def _layouts(text: str) -> list[tuple[int, int]]:
    layouts = []
    for item in text.split(","):
        tp, _, dcp = item.partition("x")
        if not (tp.isdigit() and dcp.isdigit()) or int(tp) < 1 or int(dcp) < 1:
            raise argparse.ArgumentTypeError(f"--layouts: expected TPxDCP items like 8x1,1x8, got {item!r}")
        layouts.append((int(tp), int(dcp)))
    return layouts


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(item) for item in text.split(",")]
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}") from error
    if any(size < 1 for size in sizes):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", type=_layouts, default=_layouts("1x1,8x1,1x8,2x4"), help="TPxDCP list")
    parser.add_argument("--contexts", type=_sizes, default=[32768, 131072, 1048576])
    parser.add_argument("--batches", type=_sizes, default=[1, 8, 64])
    parser.add_argument("--kv-format", choices=("bf16", "fp8"), default="bf16")
    parser.add_argument("--layers", type=int, default=27, help="layers of the K3 full preset (MLA every 4th)")
    parser.add_argument("--pool-gib", type=float, default=96.0, help="skip cells whose pools exceed this")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON lines too")
    args = parser.parse_args(argv)
    config = load_model_config(with_layers(preset_config("k3", "full"), args.layers))
    shapes, mla_layers = AttentionShapes.of(config), config.layer_types.count(LAYER_MLA)
    for tp, _ in args.layouts:
        if shapes.heads % tp:
            parser.error(f"--layouts: tp {tp} does not divide the model's {shapes.heads} attention heads")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device (the Triton kernels and CUDA-graph timing)")
    rows = []
    for context, batch, (tp, dcp) in itertools.product(args.contexts, args.batches, args.layouts):
        if not _fits(shapes, args.kv_format, context, batch, int(args.pool_gib * GIB)):
            print(
                f"skipped TP{tp}xDCP{dcp} {context} x {batch}: the group's pools exceed --pool-gib",
                flush=True,
            )
            continue
        rows.append(measure(shapes, args.kv_format, tp, dcp, context, batch, "cuda"))
        torch.cuda.empty_cache()
        if args.json:
            print(json.dumps({**asdict(rows[-1]), "total_us": rows[-1].total_us}), flush=True)
    print(_table(rows, mla_layers))


if __name__ == "__main__":
    main()
