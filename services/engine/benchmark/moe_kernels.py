"""Grouped MoE expert GEMMs at prefill sizes: ``baton bench kernels --ops moe``.

The Triton kernel (``kernels.moe.grouped``: gate-up and down in two grouped launches) against
``torch._grouped_mm`` (``kernels.moe.grouped_mm``), 4096 and 16384 tokens, at K3's routing (the
context's config: 896 experts, top 16) and Kimi-Linear-48B-A3B's (256, top 8), hidden 2304 and expert
width 1024. TFLOP/s of ``6 * tokens * top_k * D * I`` against the matrix rate (issue 12's target: >= 0.5).
"""

import torch

from kernels.moe import grouped, grouped_mm
from services.engine.checkpoint.presets import preset_config, with_layers
from services.engine.model.config_loader import load_model_config

from .kernel_bench import KernelBenchContext, KernelResult
from .timing import device_us

TOKENS = (4096, 16384)


def bench_moe(context: KernelBenchContext) -> list[KernelResult]:
    """One row per (routing, tokens): Kimi-Linear's routing first, then the context's (K3)."""
    kimi = load_model_config(with_layers(preset_config("kimi_linear", "full"), 4)).moe
    results = []
    for routing in (kimi, context.config.moe):
        experts, top_k = routing.num_experts, routing.num_experts_per_tok
        for tokens in TOKENS:
            results.append(_row(tokens, experts, top_k, context))
            torch.cuda.empty_cache()
    return results


def _row(tokens: int, experts: int, top_k: int, context: KernelBenchContext) -> KernelResult:
    device, dtype = context.device, context.dtype
    hidden, inter = context.config.hidden_size, context.config.moe.intermediate_size
    x = torch.randn(tokens, hidden, device=device, dtype=dtype)
    w_gate_up = torch.randn(experts, 2 * inter, hidden, device=device, dtype=dtype) * 0.02
    w_down = torch.randn(experts, hidden, inter, device=device, dtype=dtype) * 0.02
    expert_ids = torch.rand(tokens, experts, device=device).topk(top_k, dim=-1).indices
    weights = torch.rand(tokens, top_k, device=device)
    args = (x, expert_ids, weights, w_gate_up, w_down)
    flops = 6 * tokens * top_k * hidden * inter
    ours = device_us(lambda: grouped.moe_grouped(*args))
    try:
        peer, peer_name = flops / device_us(lambda: grouped_mm.moe_grouped(*args)) / 1e6, "torch._grouped_mm"
    except (RuntimeError, NotImplementedError) as error:  # e.g. no _grouped_mm for this GPU or build
        peer, peer_name = None, f"torch._grouped_mm failed: {str(error)[:40]}"
    return KernelResult(
        "moe", f"N={tokens} E={experts} top-{top_k} (triton)", flops / ours / 1e6, "TFLOP/s",
        context.matmul_flops / 1e12, "matmul", peer, peer_name,
    )  # fmt: skip
