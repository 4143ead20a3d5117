"""The batch-invariant Triton kernels against the default mode's: ``baton bench kernels --ops invariant``.

Issue 14's budget: invariant mode may cost at most 10% of default-mode throughput, so every row's
``vs peer`` (invariant / default) should read 0.90 or more. At the K3 shapes:

- matmul: ``invariant_linear_triton`` (fixed tiles, no split-K) vs ``x @ w.T`` (cuBLAS), the dense MLP's
  gate-up weight at decode and prefill token counts; TFLOP/s against the square-GEMM rate;
- RMSNorm: ``rms_norm_triton`` vs the default numerics' ``kernels.norm.naive.rms_norm`` over the hidden
  size; GB/s (read + write) against the copy bandwidth;
- log-softmax: ``log_softmax_triton`` vs ``torch.log_softmax`` over float32 logits of the full
  vocabulary (the sampler's log-probs); GB/s against the copy bandwidth.
"""

import torch

from kernels.invariant.linear_triton import invariant_linear_triton
from kernels.invariant.norm_triton import rms_norm_triton
from kernels.invariant.softmax_triton import log_softmax_triton
from kernels.norm.naive import rms_norm

from .kernel_bench import KernelBenchContext, KernelResult
from .timing import device_us

MATMUL_TOKENS = (1, 64, 1024, 8192)
NORM_TOKENS = (64, 8192)
LOGIT_ROWS = (1, 64, 256)
PEER = "default kernel"


def bench_invariant(context: KernelBenchContext) -> list[KernelResult]:
    """Matmul, RMSNorm and log-softmax rows, invariant value with the default kernel as the peer."""
    return _matmul_rows(context) + _norm_rows(context) + _log_softmax_rows(context)


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
