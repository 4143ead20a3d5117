"""The batch-invariant Triton kernels against the default mode's: ``baton bench kernels --ops invariant``.

Issue 14's budget: invariant mode may cost at most 10% of default-mode throughput, so every row's
``vs peer`` (invariant / default) should read 0.90 or more. At the K3 shapes:

- matmul: ``invariant_linear_triton`` (fixed tiles, no split-K) vs ``x @ w.T`` (cuBLAS), the dense MLP's
  gate-up weight at decode and prefill token counts; TFLOP/s against the square-GEMM rate;
- RMSNorm: ``rms_norm_triton`` vs the default numerics' ``kernels.norm.naive.rms_norm`` over the hidden
  size; GB/s (read + write) against the copy bandwidth;
- log-softmax: ``log_softmax_triton`` vs ``torch.log_softmax`` over float32 logits of the full
  vocabulary (the sampler's log-probs); GB/s against the copy bandwidth;
- KDA: ``kda_fixed_chunk_varlen_triton`` (the CF-BI rows, one token after another, on the slots in
  place) vs fla's ``chunk_kda`` for prefill (TFLOP/s of the chunked form's estimate, as in
  ``kda_kernels``) and ``fused_recurrent_kda`` for decode (GB/s of the state read and written).
"""

import torch

from kernels.invariant.kda_triton import kda_fixed_chunk_varlen_triton
from kernels.invariant.linear_triton import invariant_linear_triton
from kernels.invariant.norm_triton import rms_norm_triton
from kernels.invariant.softmax_triton import log_softmax_triton
from kernels.kda.fixed_chunk import CHUNK as FIXED_CHUNK
from kernels.norm.naive import rms_norm

from .kda_kernels import CHUNK, _inputs, _slot_pool  # the KDA bench's inputs and slot layout
from .kernel_bench import KernelBenchContext, KernelResult
from .timing import device_us

MATMUL_TOKENS = (1, 64, 1024, 8192)
NORM_TOKENS = (64, 8192)
LOGIT_ROWS = (1, 64, 256)
KDA_DECODE_BATCHES = (32, 256)
KDA_PREFILL_SHAPES = ((1, 4096), (16, 1024))  # (sequences, tokens each): the rows run token by token
PEER = "default kernel"


def bench_invariant(context: KernelBenchContext) -> list[KernelResult]:
    """Matmul, RMSNorm, log-softmax and KDA rows, invariant value with the default kernel as the peer."""
    return _matmul_rows(context) + _norm_rows(context) + _log_softmax_rows(context) + _kda_rows(context)


def _matmul_rows(context: KernelBenchContext) -> list[KernelResult]:
    c, device, dtype = context.config, context.device, context.dtype
    w = torch.randn(2 * c.intermediate_size, c.hidden_size, device=device, dtype=dtype)
    rows = []
    for tokens in MATMUL_TOKENS:
        x = torch.randn(tokens, c.hidden_size, device=device, dtype=dtype)
        flops = 2 * tokens * w.shape[0] * w.shape[1]
        ours = device_us(lambda x=x: invariant_linear_triton(x, w))
        peer = device_us(lambda x=x: x @ w.t())
        case = f"[{tokens}, {w.shape[1]}] x [{w.shape[1]}, {w.shape[0]}]"
        rows.append(
            KernelResult(
                "inv-mm", case, flops / ours / 1e6, "TFLOP/s", context.matmul_flops / 1e12, "square GEMM",
                flops / peer / 1e6, f"{PEER} (x @ w.T)",
            )
        )  # fmt: skip
    return rows


def _norm_rows(context: KernelBenchContext) -> list[KernelResult]:
    c, device, dtype = context.config, context.device, context.dtype
    weight = torch.randn(c.hidden_size, device=device, dtype=dtype)
    copy, rows = context.copy_bytes_per_s / 1e9, []
    for tokens in NORM_TOKENS:
        x = torch.randn(tokens, c.hidden_size, device=device, dtype=dtype)
        nbytes = 2 * x.numel() * x.element_size()
        ours = device_us(lambda x=x: rms_norm_triton(x, weight, c.rms_norm_eps))
        peer = device_us(lambda x=x: rms_norm(x, weight, c.rms_norm_eps))
        rows.append(
            KernelResult(
                "inv-norm", f"RMSNorm [{tokens}, {c.hidden_size}]", nbytes / ours / 1e3, "GB/s", copy, "copy",
                nbytes / peer / 1e3, f"{PEER} (naive.rms_norm)",
            )
        )  # fmt: skip
    return rows


def _log_softmax_rows(context: KernelBenchContext) -> list[KernelResult]:
    device, vocab = context.device, context.config.vocab_size
    copy, rows = context.copy_bytes_per_s / 1e9, []
    for batch in LOGIT_ROWS:
        logits = torch.randn(batch, vocab, device=device) * 3
        nbytes = 2 * logits.numel() * logits.element_size()
        ours = device_us(lambda logits=logits: log_softmax_triton(logits))
        peer = device_us(lambda logits=logits: torch.log_softmax(logits, dim=-1))
        case = f"log-softmax [{batch}, {vocab}] float32"
        rows.append(
            KernelResult(
                "inv-lsm", case, nbytes / ours / 1e3, "GB/s", copy, "copy",
                nbytes / peer / 1e3, f"{PEER} (torch.log_softmax)",
            )
        )  # fmt: skip
    return rows


def _open_rows(batch: int, context: KernelBenchContext):
    """Empty open-chunk rows for ``batch`` slots (``open_k``, ``open_g``, ``open_delta``, ``open_count``)."""
    kda, device = context.config.kda, context.device
    rows = torch.zeros(batch, FIXED_CHUNK, kda.num_heads, kda.head_dim, device=device)
    return rows, rows.clone(), rows.clone(), torch.zeros(batch, 1, dtype=torch.int32, device=device)


def _kda_rows(context: KernelBenchContext) -> list[KernelResult]:
    dim, heads = context.config.kda.head_dim, context.config.kda.num_heads
    copy, rows = context.copy_bytes_per_s / 1e9, []
    for batch in KDA_DECODE_BATCHES:
        ours, fla, pool = _kda_times(batch, 1, context)
        state_bytes = 2 * pool.numel() * pool.element_size()  # read and written
        rows.append(
            KernelResult(
                "inv-kda", f"decode B={batch} (CF-BI rows, slots)", state_bytes / ours / 1e3, "GB/s", copy,
                "copy", state_bytes / fla / 1e3, "fla fused_recurrent_kda",
            )
        )  # fmt: skip
    for seqs, length in KDA_PREFILL_SHAPES:
        ours, fla, _ = _kda_times(seqs, length, context)
        flops = seqs * length * heads * (10 * CHUNK * dim + 6 * dim * dim)
        rows.append(
            KernelResult(
                "inv-kda", f"prefill {seqs}x{length} (CF-BI rows, slots)", flops / ours / 1e6, "TFLOP/s",
                context.matmul_flops / 1e12, "matmul", flops / fla / 1e6, "fla chunk_kda",
            )
        )  # fmt: skip
    return rows


def _kda_times(seqs: int, length: int, context: KernelBenchContext) -> tuple[float, float, torch.Tensor]:
    """Microseconds of ours and fla's (``fused_recurrent_kda`` for one token each, else ``chunk_kda``)
    over ``seqs`` sequences of ``length`` tokens continuing their state; and the slot states."""
    from fla.ops.kda import chunk_kda, fused_recurrent_kda

    device, dim, tokens = context.device, context.config.kda.head_dim, seqs * length
    q, k, v, g, beta = _inputs(tokens, context)
    pool, open_rows = _slot_pool(seqs, context), _open_rows(seqs, context)
    slots = torch.arange(seqs, dtype=torch.int32, device=device)
    has_state = torch.ones(seqs, dtype=torch.bool, device=device)
    cu = torch.arange(0, tokens + 1, length, dtype=torch.int32, device=device)
    scale, cu_long, dense = dim**-0.5, cu.long(), pool.contiguous()
    ours = device_us(
        lambda: kda_fixed_chunk_varlen_triton(q, k, v, g, beta, scale, cu, slots, has_state, pool, *open_rows)
    )
    peer = fused_recurrent_kda if length == 1 else chunk_kda
    fla = device_us(
        lambda: peer(
            q[None], k[None], v[None], g[None], beta[None], scale=scale, initial_state=dense,
            output_final_state=True, cu_seqlens=cu_long,
        )
    )  # fmt: skip
    return ours, fla, pool
