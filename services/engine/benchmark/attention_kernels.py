"""Paged MLA decode, DSA sparse decode and the DSA indexer at real shapes, against copy bandwidth.

For each KV format (``bf16`` rows: latent + rope in the model dtype; ``fp8``: FlashMLA's 656-byte
row and the 132-byte index key), context ``N`` and batch ``B`` (every sequence ``N`` tokens long,
one decode query each, blocks shuffled in a pool laid out like ``BlockPool``):

- dense decode time, the bytes it must read (``B * N`` rows), achieved GB/s, and that over the
  copy bandwidth measured in the same run (a large device-to-device copy, read + write bytes) and
  over the issue's 4.3 TB/s;
- DSA sparse decode over ``topk`` random positions: time, its ratio to dense, the byte ratio, and
  ``(sparse / dense) / byte ratio`` (the issue's target: <= 1.15 at N >= 32K);
- the indexer (scores kernel + device top-k) time;
- a chunked-prefill row: a chunk of ``prefill_chunk`` tokens of one sequence after a prefix of
  ``N - prefill_chunk`` (absorbed form, one program per query token), in TFLOP/s.

Timings are ``triton.testing.do_bench`` medians (L2 flushed between runs); decode steps are timed
as CUDA-graph replays (how the engine runs them: without the graph, Python launch cost of about
45 us hides every small step). Run on a GPU::

    python -m services.engine.benchmark.attention_kernels --contexts 2048,8192,32768,131072 --batches 1,32
"""

import argparse
from dataclasses import asdict, dataclass

import torch
import triton

from kernels.dsa.paged_triton import paged_indexer_scores, paged_indexer_topk, topk_by_score
from kernels.fp8.naive import index_key_fp8_bytes, latent_fp8_bytes
from kernels.mla.paged_triton import default_config, default_num_splits, paged_mla_decode, paged_mla_prefill

ISSUE_BANDWIDTH = 4.3e12  # bytes/s, the H200 copy bandwidth the issue's targets refer to


@dataclass(frozen=True)
class AttentionShapes:
    """Per-layer shapes (Kimi-Linear-48B-A3B's MLA; the K3 variant adds the DSA indexer)."""

    heads: int = 32
    kv_lora_rank: int = 512
    rope_dim: int = 64
    nope_dim: int = 128
    index_heads: int = 64
    index_dim: int = 128
    topk: int = 2048
    block_size: int = 64


@dataclass(frozen=True)
class AttentionKernelRow:
    """One (format, context, batch) measurement; times in microseconds, bandwidths in GB/s."""

    kv_format: str
    context: int
    batch: int
    num_splits: int
    dense_us: float
    dense_bytes: int
    dense_gbps: float
    dense_of_copy: float
    dense_of_issue: float
    sparse_us: float
    sparse_bytes: int
    sparse_over_dense: float
    byte_ratio: float
    sparse_ratio_over_bytes: float
    indexer_scores_us: float
    indexer_topk_us: float
    indexer_us: float

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SplitSweepRow:
    """Dense bf16-row decode at batch 1 for one split count (to tune ``default_num_splits``)."""

    context: int
    num_splits: int
    us: float
    gbps: float


@dataclass(frozen=True)
class PrefillRow:
    """A chunk of ``chunk`` queries after ``context - chunk`` cached tokens, one sequence."""

    kv_format: str
    context: int
    chunk: int
    us: float
    tflops: float


def _bench(fn) -> float:
    """Median microseconds of ``fn()`` (``do_bench`` flushes L2 between runs)."""
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def _bench_graph(fn) -> float:
    """Median microseconds of one CUDA-graph replay of ``fn()`` (as the engine runs a decode step:
    no Python launch cost, which otherwise dominates small steps), L2 flushed before each replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile and warm outside the capture
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return _bench(graph.replay)


def measure_copy_bandwidth(device: torch.device, nbytes: int = 1 << 31) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting the bytes read and the bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = _bench(lambda: dst.copy_(src)) * 1e-6
    return 2 * nbytes / seconds


class _Pool:
    """One MLA layer's fields in ``num_blocks`` blocks (a ``BlockPool``-like storage), random rows."""

    def __init__(self, shapes: AttentionShapes, num_blocks: int, kv_format: str, device: torch.device):
        b, dc, dr, di = shapes.block_size, shapes.kv_lora_rank, shapes.rope_dim, shapes.index_dim
        self.fp8 = kv_format == "fp8"
        if self.fp8:
            fields = [(latent_fp8_bytes(dc, dr), torch.uint8), (index_key_fp8_bytes(di), torch.uint8)]
        else:
            fields = [(dc, torch.bfloat16), (dr, torch.bfloat16), (di, torch.bfloat16)]
        sizes = [-(-b * w * t.itemsize // 64) * 64 for w, t in fields]
        self.storage = torch.empty(num_blocks, sum(sizes), dtype=torch.uint8, device=device)
        views, offset = [], 0
        for (width, dtype), size in zip(fields, sizes, strict=True):
            raw = self.storage[:, offset : offset + b * width * dtype.itemsize]
            views.append(raw.view(dtype).view(num_blocks, b, width))
            offset += size
        if self.fp8:
            self.latent, self.rope, self.index_key = views[0], None, views[1]
            _fill_fp8_rows(self.latent, dc, dc // min(128, dc))
            _fill_fp8_rows(self.index_key, di, 1)
        else:
            self.latent, self.rope, self.index_key = views
            for view in views:
                view.normal_()
        self.row_bytes = self.latent.shape[2] * self.latent.element_size()
        if self.rope is not None:
            self.row_bytes += self.rope.shape[2] * self.rope.element_size()
        self.index_row_bytes = self.index_key.shape[2] * self.index_key.element_size()


def _fill_fp8_rows(view: torch.Tensor, values: int, groups: int) -> None:
    """Finite e4m3 bytes (no NaN code), scales of 1/64, and the rest (the bf16 rope part) small normals."""
    magnitude = torch.randint(0, 0x70, view[..., :values].shape, dtype=torch.uint8, device=view.device)
    sign = torch.randint(0, 2, view[..., :values].shape, dtype=torch.uint8, device=view.device) << 7
    view[..., :values] = magnitude | sign
    scales = torch.full((*view.shape[:2], groups), 1 / 64, dtype=torch.float32, device=view.device)
    view[..., values : values + 4 * groups] = scales.view(torch.uint8)
    rest = view.shape[2] - values - 4 * groups
    if rest:
        view[..., values + 4 * groups :] = (
            torch.randn(*view.shape[:2], rest // 2, device=view.device).to(torch.bfloat16).view(torch.uint8)
        )


def _measure(shapes: AttentionShapes, kv_format: str, context: int, batch: int, copy_bw: float, device):
    blocks_per_seq = -(-context // shapes.block_size)
    pool = _Pool(shapes, batch * blocks_per_seq, kv_format, device)
    tables = torch.randperm(batch * blocks_per_seq, device=device).to(torch.int32).view(batch, blocks_per_seq)
    query_seq = torch.arange(batch, dtype=torch.int32, device=device)
    query_pos = torch.full((batch,), context - 1, dtype=torch.int32, device=device)
    h, dc, dr = shapes.heads, shapes.kv_lora_rank, shapes.rope_dim
    q_latent = torch.randn(batch, h, dc, device=device).to(torch.bfloat16) * 0.05
    q_rope = torch.randn(batch, h, dr, device=device).to(torch.bfloat16) * 0.05
    scale = (shapes.nope_dim + dr) ** -0.5
    keys = min(shapes.topk, context)
    topk = torch.rand(batch, context, device=device).argsort(dim=1)[:, : shapes.topk].to(torch.int32)
    if keys < shapes.topk:
        topk = torch.cat([topk, topk.new_full((batch, shapes.topk - keys), -1)], dim=1)
    mla = (q_latent, q_rope, pool.latent, pool.rope, tables, query_seq, query_pos)
    dense_us = _bench_graph(lambda: paged_mla_decode(*mla, None, scale, context))
    sparse_us = _bench_graph(lambda: paged_mla_decode(*mla, topk, scale, context))

    q_index = torch.randn(batch, shapes.index_heads, shapes.index_dim, device=device).to(torch.bfloat16)
    weights = torch.randn(batch, shapes.index_heads, device=device) * shapes.index_heads**-0.5
    index = (q_index, weights, pool.index_key, tables, query_seq, query_pos)
    width = max(context, shapes.topk)
    scores_us = _bench(lambda: paged_indexer_scores(*index, shapes.index_dim**-0.5, width))
    scores = paged_indexer_scores(*index, shapes.index_dim**-0.5, width)
    topk_us = _bench(lambda: topk_by_score(scores, shapes.topk))
    indexer_us = _bench(lambda: paged_indexer_topk(*index, shapes.topk, shapes.index_dim**-0.5, context))

    dense_bytes = batch * context * pool.row_bytes
    sparse_bytes = batch * keys * (pool.row_bytes + 4)
    dense_bps = dense_bytes / (dense_us * 1e-6)
    head_groups = triton.cdiv(h, max(16, min(triton.next_power_of_2(h), 32)))
    block_n = default_config(torch.device(device), torch.bfloat16, pool.fp8, False).block_n
    splits = default_num_splits(batch, head_groups, context, block_n, torch.device(device))
    row = AttentionKernelRow(
        kv_format, context, batch, splits, dense_us, dense_bytes, dense_bps / 1e9, dense_bps / copy_bw,
        dense_bps / ISSUE_BANDWIDTH, sparse_us, sparse_bytes, sparse_us / dense_us,
        sparse_bytes / dense_bytes, (sparse_us / dense_us) / (sparse_bytes / dense_bytes),
        scores_us, topk_us, indexer_us,
    )  # fmt: skip
    del pool
    return row


def _sweep_splits(
    shapes: AttentionShapes, context: int, splits: tuple[int, ...], device
) -> list[SplitSweepRow]:
    blocks = -(-context // shapes.block_size)
    pool = _Pool(shapes, blocks, "bf16", device)
    tables = torch.randperm(blocks, device=device).to(torch.int32)[None]
    one = torch.zeros(1, dtype=torch.int32, device=device)
    pos = torch.full((1,), context - 1, dtype=torch.int32, device=device)
    q_latent = torch.randn(1, shapes.heads, shapes.kv_lora_rank, device=device).to(torch.bfloat16) * 0.05
    q_rope = torch.randn(1, shapes.heads, shapes.rope_dim, device=device).to(torch.bfloat16) * 0.05
    args = (q_latent, q_rope, pool.latent, pool.rope, tables, one, pos, None, 0.07, context)
    rows = []
    for count in splits:
        us = _bench_graph(lambda count=count: paged_mla_decode(*args, num_splits=count))
        rows.append(SplitSweepRow(context, count, us, context * pool.row_bytes / (us * 1e-6) / 1e9))
    return rows


def _measure_prefill(shapes: AttentionShapes, kv_format: str, context: int, chunk: int, device) -> PrefillRow:
    chunk = min(chunk, context)
    blocks = -(-context // shapes.block_size)
    pool = _Pool(shapes, blocks, kv_format, device)
    tables = torch.randperm(blocks, device=device).to(torch.int32)[None]
    query_seq = torch.zeros(chunk, dtype=torch.int32, device=device)
    query_pos = torch.arange(context - chunk, context, dtype=torch.int32, device=device)
    h, dc, dr = shapes.heads, shapes.kv_lora_rank, shapes.rope_dim
    q_latent = torch.randn(chunk, h, dc, device=device).to(torch.bfloat16) * 0.05
    q_rope = torch.randn(chunk, h, dr, device=device).to(torch.bfloat16) * 0.05
    args = (q_latent, q_rope, pool.latent, pool.rope, tables, query_seq, query_pos, None, 0.07, context)
    us = _bench(lambda: paged_mla_prefill(*args))
    attended = sum(context - chunk + i + 1 for i in range(chunk))
    flops = 2 * h * attended * (dc + dr + dc)  # QK over latent + rope, then PV over the latent
    return PrefillRow(kv_format, context, chunk, us, flops / (us * 1e-6) / 1e12)


def run_attention_kernel_bench(
    device: str = "cuda",
    contexts: tuple[int, ...] = (2048, 8192, 32768, 131072),
    batches: tuple[int, ...] = (1, 32),
    kv_formats: tuple[str, ...] = ("bf16", "fp8"),
    shapes: AttentionShapes = AttentionShapes(),
    prefill_chunk: int = 2048,
    split_sweep: tuple[int, ...] = (1, 16, 32, 64, 132, 264, 528),
) -> tuple[float, list[AttentionKernelRow], list[PrefillRow], list[SplitSweepRow]]:
    """Measure every (format, context, batch); returns ``(copy bytes/s, decode rows, prefill rows,
    split-sweep rows)`` (the sweep: dense bf16-row decode at batch 1 for each split count, each context)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        raise RuntimeError(f"the attention kernel benchmark needs a CUDA device, got {device!r}")
    if dev.index is None:  # "cuda": the current device, named by index so set_device accepts it
        dev = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(dev)
    copy_bw = measure_copy_bandwidth(dev)
    rows, prefill, sweep = [], [], []
    for context in contexts:
        sweep += _sweep_splits(shapes, context, split_sweep, dev)
        torch.cuda.empty_cache()
    for kv_format in kv_formats:
        for context in contexts:
            for batch in batches:
                rows.append(_measure(shapes, kv_format, context, batch, copy_bw, dev))
                torch.cuda.empty_cache()
            prefill.append(_measure_prefill(shapes, kv_format, context, prefill_chunk, dev))
            torch.cuda.empty_cache()
    return copy_bw, rows, prefill, sweep


def format_tables(
    copy_bw: float, rows: list[AttentionKernelRow], prefill: list[PrefillRow], sweep: list[SplitSweepRow]
) -> str:
    """The decode table, the prefill table and the split sweep, as fixed-width text."""
    lines = [
        f"copy bandwidth (read + write): {copy_bw / 1e9:.0f} GB/s; "
        f"issue's reference {ISSUE_BANDWIDTH / 1e9:.0f} GB/s",
        "launches per layer step: MLA decode 1 (one split) or 2 (split + combine); "
        "indexer 1 kernel + torch top-k",
        "",
        f"{'fmt':>4} {'N':>7} {'B':>3} {'splits':>6} | {'dense us':>9} {'MB':>8} {'GB/s':>6} {'/copy':>6} "
        f"{'/4.3T':>6} | {'sparse us':>9} {'sp/dn':>6} {'bytes':>6} {'ratio':>6} | {'idx us':>8} "
        f"{'scores':>8} {'topk':>8}",
    ]
    for r in rows:
        lines.append(
            f"{r.kv_format:>4} {r.context:>7} {r.batch:>3} {r.num_splits:>6} | {r.dense_us:>9.1f} "
            f"{r.dense_bytes / 1e6:>8.1f} {r.dense_gbps:>6.0f} {r.dense_of_copy:>6.2f} "
            f"{r.dense_of_issue:>6.2f} | {r.sparse_us:>9.1f} {r.sparse_over_dense:>6.3f} "
            f"{r.byte_ratio:>6.3f} {r.sparse_ratio_over_bytes:>6.2f} | "
            f"{r.indexer_us:>8.1f} {r.indexer_scores_us:>8.1f} {r.indexer_topk_us:>8.1f}"
        )
    lines += ["", "ratio = (sparse / dense time) / (sparse / dense bytes); target <= 1.15 at N >= 32K", ""]
    lines.append(
        f"{'fmt':>4} {'N':>7} {'chunk':>6} | {'prefill us':>10} {'TFLOP/s':>8}"
        "  (absorbed, one program per query token)"
    )
    for p in prefill:
        lines.append(f"{p.kv_format:>4} {p.context:>7} {p.chunk:>6} | {p.us:>10.1f} {p.tflops:>8.1f}")
    lines += ["", "split sweep, dense bf16 rows, batch 1:", f"{'N':>7} {'splits':>6} | {'us':>8} {'GB/s':>6}"]
    for w in sweep:
        lines.append(f"{w.context:>7} {w.num_splits:>6} | {w.us:>8.1f} {w.gbps:>6.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--contexts", default="2048,8192,32768,131072")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--kv-formats", default="bf16,fp8")
    parser.add_argument("--heads", type=int, default=AttentionShapes.heads)
    parser.add_argument("--prefill-chunk", type=int, default=2048)
    args = parser.parse_args(argv)
    ints = lambda text: tuple(int(x) for x in text.split(","))  # noqa: E731
    copy_bw, rows, prefill, sweep = run_attention_kernel_bench(
        args.device, ints(args.contexts), ints(args.batches), tuple(args.kv_formats.split(",")),
        AttentionShapes(heads=args.heads), args.prefill_chunk,
    )  # fmt: skip
    print(format_tables(copy_bw, rows, prefill, sweep), flush=True)


if __name__ == "__main__":
    main()
