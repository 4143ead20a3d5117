"""KDA decode and chunked prefill at the ``full`` preset's layer shape against fla's own kernels:
``baton bench kernels --ops kda``.

- Decode, batch 1 / 32 / 256 (32 heads x 128: a 2 MiB float32 state per request): ours is
  ``kernels.kda.varlen.kda_varlen`` on strided slots, in place; the peer is fla's public
  ``fused_recurrent_kda`` (dense state in, new state out). GB/s of the state read and written,
  against the copy bandwidth (issue 12's target: >= 0.7). Both are timed as CUDA-graph replays, as
  the engine runs a decode step.
- Chunked prefill, 1 x 16384, 4 x 4096 and 16 x 1024 tokens: ours (through the slots) against fla's
  ``chunk_kda`` on a dense state (target: within 10%, ``vs peer >= 0.9``). TFLOP/s of the chunked
  form's matrix work, an estimate per token and head of ``10 * C * d + 6 * d^2`` (C = 64 rows a chunk:
  the intra-chunk ``k k^T``, ``q k^T``, ``A k``, ``A v`` and ``A v_new``; the state terms ``w S``,
  ``q S`` and ``k^T v``), against the matrix rate.
"""

import torch
import torch.nn.functional as F

from kernels.kda.varlen import kda_varlen

from .kernel_bench import KernelBenchContext, KernelResult
from .timing import device_us, graph_us

DECODE_BATCHES = (1, 32, 256)
PREFILL_SHAPES = ((1, 16384), (4, 4096), (16, 1024))  # (sequences, tokens each)
CHUNK = 64  # fla's chunk rows, for the prefill FLOP estimate


def bench_kda(context: KernelBenchContext) -> list[KernelResult]:
    """Decode rows per batch, then prefill rows per shape."""
    results = [_decode_row(batch, context) for batch in DECODE_BATCHES]
    results += [_prefill_row(seqs, length, context) for seqs, length in PREFILL_SHAPES]
    return results


def _slot_pool(batch: int, context: KernelBenchContext) -> torch.Tensor:
    """``[batch, H, K, V]`` float32 recurrent states, strided like one KDA layer's slot in
    ``slot_layout`` (the state, then the short-conv tail in the model dtype), small random values."""
    kda = context.config.kda
    heads, dim = kda.num_heads, kda.head_dim
    state = heads * dim * dim
    conv_bytes = 3 * heads * dim * (kda.conv_kernel_size - 1) * context.dtype.itemsize
    slot_bytes = -(-(state * 4 + conv_bytes) // 64) * 64
    storage = torch.zeros(batch, slot_bytes, dtype=torch.uint8, device=context.device)
    pool = storage[:, : state * 4].view(torch.float32).view(batch, heads, dim, dim)
    pool.copy_(torch.randn_like(pool) * 0.01)
    return pool


def _inputs(tokens: int, context: KernelBenchContext):
    """``q, k`` L2-normalised, ``v`` ``[T, H, d]`` in the model dtype; ``g`` float32 log decays; ``beta``."""
    heads, device, dtype = context.config.kda.num_heads, context.device, context.dtype
    shape = (tokens, heads, context.config.kda.head_dim)
    q = F.normalize(torch.randn(shape, device=device), dim=-1).to(dtype)
    k = F.normalize(torch.randn(shape, device=device), dim=-1).to(dtype)
    v = torch.randn(shape, device=device).to(dtype)
    g = -torch.rand(shape, device=device) * 0.1
    beta = torch.rand(tokens, heads, device=device).to(dtype)
    return q, k, v, g, beta


def _decode_row(batch: int, context: KernelBenchContext) -> KernelResult:
    from fla.ops.kda import fused_recurrent_kda

    device, dim = context.device, context.config.kda.head_dim
    q, k, v, g, beta = _inputs(batch, context)
    pool = _slot_pool(batch, context)
    slots = torch.arange(batch, dtype=torch.int32, device=device).flip(0)
    has_state = torch.ones(batch, dtype=torch.bool, device=device)
    cu = torch.arange(batch + 1, dtype=torch.int32, device=device)
    cu_long, dense, scale = cu.long(), pool.contiguous(), dim**-0.5
    # Every sequence continues its state (any_fresh False): the engine's decode step, no zeroing launch.
    ours = graph_us(lambda: kda_varlen(q, k, v, g, beta, scale, pool, slots, has_state, cu, 1, False))
    fla = graph_us(
        lambda: fused_recurrent_kda(
            q[None], k[None], v[None], g[None], beta[None], scale=scale, initial_state=dense,
            output_final_state=True, cu_seqlens=cu_long,
        )
    )  # fmt: skip
    state_bytes = 2 * pool.numel() * pool.element_size()  # read and written
    return KernelResult(
        "kda", f"decode B={batch} (slots, in place)", state_bytes / ours / 1e3, "GB/s",
        context.copy_bytes_per_s / 1e9, "copy", state_bytes / fla / 1e3, "fla fused_recurrent_kda",
    )  # fmt: skip


def _prefill_row(seqs: int, length: int, context: KernelBenchContext) -> KernelResult:
    from fla.ops.kda import chunk_kda

    device, heads, dim = context.device, context.config.kda.num_heads, context.config.kda.head_dim
    tokens = seqs * length
    q, k, v, g, beta = _inputs(tokens, context)
    pool = _slot_pool(seqs, context)
    slots = torch.arange(seqs, dtype=torch.int32, device=device)
    has_state = torch.ones(seqs, dtype=torch.bool, device=device)
    cu = torch.arange(0, tokens + 1, length, dtype=torch.int32, device=device)
    cu_long, dense, scale = cu.long(), pool.contiguous(), dim**-0.5
    fla = device_us(
        lambda: chunk_kda(
            q[None], k[None], v[None], g[None], beta[None], scale=scale, initial_state=dense,
            output_final_state=True, cu_seqlens=cu_long,
        )
    )  # fmt: skip
    ours = device_us(lambda: kda_varlen(q, k, v, g, beta, scale, pool, slots, has_state, cu, length, False))
    flops = tokens * heads * (10 * CHUNK * dim + 6 * dim * dim)
    return KernelResult(
        "kda", f"prefill {seqs}x{length} (slots)", flops / ours / 1e6, "TFLOP/s",
        context.matmul_flops / 1e12, "matmul", flops / fla / 1e6, "fla chunk_kda",
    )  # fmt: skip
