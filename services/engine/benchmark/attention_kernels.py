"""Paged MLA decode (dense and DSA top-k), chunked MLA prefill and the DSA indexer at real shapes:
``baton bench kernels --ops mla,indexer``.

For each KV format (``bf16`` rows: latent + rope in the model dtype; ``fp8``: FlashMLA's 656-byte
row and the 132-byte index key), context ``N`` and batch ``B`` (every sequence ``N`` tokens long,
one decode query each, blocks shuffled in a pool laid out like ``BlockPool``):

- ``mla`` dense decode: GB/s of the rows it must read (``B * N``) against the copy bandwidth, with
  the split count the kernel chose;
- ``mla`` DSA sparse decode over ``topk`` random positions: GB/s of its rows (and their indices)
  against the copy bandwidth, with dense decode of the same step as the peer. Its ``vs peer`` is
  ``1 / ((sparse / dense time) / (sparse / dense bytes))``: the issue's target (that ratio <= 1.15
  at N >= 32K) reads ``vs peer >= 0.87``;
- ``mla`` chunked prefill: a chunk of ``PREFILL_CHUNK`` tokens of one sequence after ``N - chunk``
  cached ones (absorbed form, one program per query token), TFLOP/s against the matrix rate;
- ``indexer``: the scores kernel alone and scores + device top-k, GB/s of the index keys it reads.

Launches per layer step: MLA decode 1 (one split) or 2 (split + combine); indexer 1 kernel + torch
top-k. Decode steps are timed as CUDA-graph replays (``timing.graph_us``: how the engine runs them),
prefill chunks with ``timing.device_us``. Tile and split sweeps: ``attention_tuning``.
"""

import itertools
from dataclasses import dataclass

import torch
import triton

from kernels.dsa.paged_triton import paged_indexer_scores, paged_indexer_topk
from kernels.fp8.naive import index_key_fp8_bytes, latent_fp8_bytes
from kernels.mla.paged_triton import default_config, default_num_splits, paged_mla_decode, paged_mla_prefill
from services.engine.model.config import ModelConfig

from .kernel_bench import KernelBenchContext, KernelResult
from .timing import device_us, graph_us

KV_FORMATS = ("bf16", "fp8")
SEQ_LENS = (2048, 8192, 32768, 131072)
BATCHES = (1, 32)
PREFILL_CHUNK = 2048


@dataclass(frozen=True)
class AttentionShapes:
    """Per-layer shapes (Kimi-Linear-48B-A3B's MLA; the K3 variant adds the DSA indexer); the
    defaults are the ``full`` preset's."""

    heads: int = 32
    kv_lora_rank: int = 512
    rope_dim: int = 64
    nope_dim: int = 128
    index_heads: int = 64
    index_dim: int = 128
    topk: int = 2048
    block_size: int = 64

    @classmethod
    def of(cls, config: ModelConfig) -> "AttentionShapes":
        """The MLA and indexer shapes of ``config`` (which must have an indexer)."""
        return cls(
            config.num_attention_heads, config.kv_lora_rank, config.qk_rope_head_dim,
            config.qk_nope_head_dim, config.indexer.n_heads, config.indexer.head_dim, config.indexer.topk,
        )  # fmt: skip


class _Pool:
    """One MLA layer's fields in ``num_blocks`` blocks (a ``BlockPool``-like storage), random rows."""

    def __init__(self, shapes: AttentionShapes, num_blocks: int, kv_format: str, device: str | torch.device):
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


class PagedDecodeStep:
    """One decode step's inputs: ``batch`` sequences of ``seq_len`` tokens in a shuffled pool."""

    def __init__(self, shapes: AttentionShapes, kv_format: str, seq_len: int, batch: int, device: str):
        blocks_per_seq = -(-seq_len // shapes.block_size)
        self.pool = _Pool(shapes, batch * blocks_per_seq, kv_format, device)
        self.tables = (
            torch.randperm(batch * blocks_per_seq, device=device).to(torch.int32).view(batch, blocks_per_seq)
        )
        self.query_seq = torch.arange(batch, dtype=torch.int32, device=device)
        self.query_pos = torch.full((batch,), seq_len - 1, dtype=torch.int32, device=device)


def bench_mla(context: KernelBenchContext) -> list[KernelResult]:
    """Dense and DSA decode per (format, N, B), then a chunked prefill per (format, N)."""
    results = _each_step(context, _decode_rows)
    for kv_format, seq_len in itertools.product(KV_FORMATS, SEQ_LENS):
        results.append(_prefill_row(AttentionShapes.of(context.config), kv_format, seq_len, context))
        torch.cuda.empty_cache()
    return results


def bench_indexer(context: KernelBenchContext) -> list[KernelResult]:
    """The scores kernel alone and scores + device top-k per (format, N, B), GB/s of index keys."""
    return _each_step(context, _indexer_rows)


def _each_step(context: KernelBenchContext, rows_of) -> list[KernelResult]:
    """``rows_of(shapes, kv_format, seq_len, batch, context)`` for every decode step, in order, each
    step's pool freed before the next."""
    shapes, results = AttentionShapes.of(context.config), []
    for kv_format, seq_len, batch in itertools.product(KV_FORMATS, SEQ_LENS, BATCHES):
        results += rows_of(shapes, kv_format, seq_len, batch, context)
        torch.cuda.empty_cache()
    return results


def _decode_rows(shapes, kv_format, seq_len, batch, context: KernelBenchContext) -> list[KernelResult]:
    device = context.device
    step = PagedDecodeStep(shapes, kv_format, seq_len, batch, device)
    h, dc, dr = shapes.heads, shapes.kv_lora_rank, shapes.rope_dim
    q_latent = torch.randn(batch, h, dc, device=device).to(torch.bfloat16) * 0.05
    q_rope = torch.randn(batch, h, dr, device=device).to(torch.bfloat16) * 0.05
    scale = (shapes.nope_dim + dr) ** -0.5
    keys = min(shapes.topk, seq_len)
    topk = torch.rand(batch, seq_len, device=device).argsort(dim=1)[:, : shapes.topk].to(torch.int32)
    if keys < shapes.topk:
        topk = torch.cat([topk, topk.new_full((batch, shapes.topk - keys), -1)], dim=1)
    pool = step.pool
    mla = (q_latent, q_rope, pool.latent, pool.rope, step.tables, step.query_seq, step.query_pos)
    dense_us = graph_us(lambda: paged_mla_decode(*mla, None, scale, seq_len))
    sparse_us = graph_us(lambda: paged_mla_decode(*mla, topk, scale, seq_len))
    dense_gbps = batch * seq_len * pool.row_bytes / dense_us / 1e3
    sparse_gbps = batch * keys * (pool.row_bytes + 4) / sparse_us / 1e3
    head_groups = triton.cdiv(h, max(16, min(triton.next_power_of_2(h), 32)))
    block_n = default_config(torch.device(device), torch.bfloat16, pool.fp8, False).block_n
    splits = default_num_splits(batch, head_groups, seq_len, block_n, torch.device(device))
    copy = context.copy_bytes_per_s / 1e9
    where = f"N={seq_len} B={batch}"
    return [
        KernelResult("mla", f"{kv_format} dense {where} ({splits} splits)", dense_gbps, "GB/s", copy, "copy"),
        KernelResult(
            "mla", f"{kv_format} DSA top-{shapes.topk} {where}", sparse_gbps, "GB/s", copy, "copy",
            dense_gbps, "dense decode",
        ),
    ]  # fmt: skip


def _prefill_row(shapes, kv_format, seq_len, context: KernelBenchContext) -> KernelResult:
    device, chunk = context.device, min(PREFILL_CHUNK, seq_len)
    step = PagedDecodeStep(shapes, kv_format, seq_len, 1, device)
    query_seq = torch.zeros(chunk, dtype=torch.int32, device=device)
    query_pos = torch.arange(seq_len - chunk, seq_len, dtype=torch.int32, device=device)
    h, dc, dr = shapes.heads, shapes.kv_lora_rank, shapes.rope_dim
    q_latent = torch.randn(chunk, h, dc, device=device).to(torch.bfloat16) * 0.05
    q_rope = torch.randn(chunk, h, dr, device=device).to(torch.bfloat16) * 0.05
    pool = step.pool
    args = (q_latent, q_rope, pool.latent, pool.rope, step.tables, query_seq, query_pos, None, 0.07, seq_len)
    us = device_us(lambda: paged_mla_prefill(*args))
    attended = chunk * (seq_len - chunk) + chunk * (chunk + 1) // 2
    flops = 2 * h * attended * (dc + dr + dc)  # QK over latent + rope, then PV over the latent
    return KernelResult(
        "mla", f"{kv_format} prefill {chunk} after {seq_len - chunk}", flops / us / 1e6, "TFLOP/s",
        context.matmul_flops / 1e12, "matmul",
    )  # fmt: skip


def _indexer_rows(shapes, kv_format, seq_len, batch, context: KernelBenchContext) -> list[KernelResult]:
    device = context.device
    step = PagedDecodeStep(shapes, kv_format, seq_len, batch, device)
    q_index = torch.randn(batch, shapes.index_heads, shapes.index_dim, device=device).to(torch.bfloat16)
    weights = torch.randn(batch, shapes.index_heads, device=device) * shapes.index_heads**-0.5
    index = (q_index, weights, step.pool.index_key, step.tables, step.query_seq, step.query_pos)
    scale, width = shapes.index_dim**-0.5, max(seq_len, shapes.topk)
    scores_us = graph_us(lambda: paged_indexer_scores(*index, scale, width))
    topk_us = graph_us(lambda: paged_indexer_topk(*index, shapes.topk, scale, seq_len))
    key_bytes = batch * seq_len * step.pool.index_row_bytes
    copy, where = context.copy_bytes_per_s / 1e9, f"N={seq_len} B={batch}"
    return [
        KernelResult("indexer", f"{kv_format} {what} {where}", key_bytes / us / 1e3, "GB/s", copy, "copy")
        for what, us in (("scores", scores_us), (f"scores + top-{shapes.topk}", topk_us))
    ]
